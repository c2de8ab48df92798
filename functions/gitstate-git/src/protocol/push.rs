//! Push (send-pack): ref update commands, the capabilities they need, the report-status.

use gix::ObjectId;

use super::{AGENT, Advert, pkt};
use crate::transport;

/// Why a push had no verdict: the capabilities it needs are not offered, the report-status is
/// not one, or the wire failed. The remote's own refusals ([`Self::refused`]) are transient, a
/// malformed or impossible exchange is not.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error(
        "git protocol error: the remote does not offer report-status, so a push's outcome could not be known"
    )]
    NoReportStatus,
    #[error(
        "git protocol error: several ref updates in one push need atomic, which the remote does not offer"
    )]
    NoAtomic,
    #[error("git remote reports: the remote does not allow deleting refs")]
    NoDeleteRefs,
    #[error("git protocol error: empty report-status")]
    EmptyReport,
    #[error("git remote reports: the remote could not unpack: {0}")]
    Unpack(String),
    #[error("git protocol error: report-status does not start with 'unpack'")]
    NoUnpack,
    #[error("git protocol error: unexpected report-status line {0:?}")]
    UnexpectedLine(String),
    /// The exchange itself, or its pkt-lines and side-band.
    #[error(transparent)]
    Wire(#[from] transport::Error),
}

impl PushError {
    /// The remote's own refusal (or an error it reported), which a fresh look may get past,
    /// rather than an exchange that cannot work.
    pub fn refused(&self) -> bool {
        match self {
            Self::NoDeleteRefs | Self::Unpack(_) => true,
            Self::NoReportStatus
            | Self::NoAtomic
            | Self::EmptyReport
            | Self::NoUnpack
            | Self::UnexpectedLine(_) => false,
            Self::Wire(wire) => wire.refused(),
        }
    }

    /// The wire's failure, if that is what this is.
    pub fn wire(&self) -> Option<&transport::Error> {
        match self {
            Self::Wire(wire) => Some(wire),
            _ => None,
        }
    }

    /// The push had an answer, but no report-status could be read from it, or it could not
    /// be sent as asked (no `report-status`, no `atomic`).
    pub fn garbled(&self) -> bool {
        match self {
            Self::NoReportStatus
            | Self::NoAtomic
            | Self::EmptyReport
            | Self::NoUnpack
            | Self::UnexpectedLine(_) => true,
            Self::NoDeleteRefs | Self::Unpack(_) => false,
            Self::Wire(wire) => wire.garbled(),
        }
    }
}

/// One ref update of a push. A zero `old` creates; a zero `new` deletes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub old: ObjectId,
    pub new: ObjectId,
    pub name: String,
}

/// The server's verdict on each ref of a push: `Ok(())` or `Err(reason)`.
#[derive(Debug, Clone, Default)]
pub struct PushReport {
    pub refs: Vec<(String, Result<(), String>)>,
}

impl PushReport {
    pub fn all_ok(&self, commands: &[Command]) -> bool {
        commands.iter().all(|c| {
            self.refs
                .iter()
                .any(|(name, status)| *name == c.name && status.is_ok())
        })
    }

    /// Each command's verdict, in the order sent: the report answers commands in that order,
    /// so the n-th command naming a ref takes the n-th verdict on it (a push may name a ref
    /// twice, each command standing alone). A command the report does not answer is refused.
    pub fn verdicts(&self, commands: &[Command]) -> Vec<bool> {
        commands
            .iter()
            .enumerate()
            .map(|(i, command)| {
                let before = commands[..i]
                    .iter()
                    .filter(|c| c.name == command.name)
                    .count();
                self.refs
                    .iter()
                    .filter(|(name, _)| *name == command.name)
                    .nth(before)
                    .is_some_and(|(_, status)| status.is_ok())
            })
            .collect()
    }

    /// Parse report-status (`unpack ok`, then `ok <ref>` / `ng <ref> <reason>` lines).
    pub fn parse(data: &[u8]) -> Result<Self, PushError> {
        let mut reader = pkt::Reader::new(data);
        let unpack = reader.next_line()?.ok_or(PushError::EmptyReport)?;
        match unpack.strip_prefix(b"unpack ") {
            Some(b"ok") => {}
            Some(why) => {
                return Err(PushError::Unpack(String::from_utf8_lossy(why).into_owned()));
            }
            None => return Err(PushError::NoUnpack),
        }
        let mut report = PushReport::default();
        while let Some(line) = reader.next_line()? {
            let text = String::from_utf8_lossy(line);
            if let Some(name) = text.strip_prefix("ok ") {
                report.refs.push((name.to_owned(), Ok(())));
            } else if let Some(rest) = text.strip_prefix("ng ") {
                let (name, why) = rest.split_once(' ').unwrap_or((rest, ""));
                report.refs.push((name.to_owned(), Err(why.to_owned())));
            } else {
                return Err(PushError::UnexpectedLine(text.into_owned()));
            }
        }
        Ok(report)
    }
}

/// How the commands of one push stand together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Updates {
    /// All of them or none (`atomic`, which several commands need the remote to offer).
    Atomic,
    /// Each one alone, with a verdict of its own: git's receive-pack applies them one after
    /// another, in the order they are sent.
    EachAlone,
}

/// What a push asks for: only capabilities `caps` advertised. `report-status` is required (the
/// verdict on each ref is what every decision rests on); `atomic` for several commands that
/// stand together ([`Updates::Atomic`]), which a caller must not send to a remote without it;
/// `side-band-64k` when offered; `report-status-v2`, `ofs-delta` (our packs hold whole
/// objects), `quiet` and `push-options` never.
pub fn push_capabilities(
    caps: &Advert,
    commands: &[Command],
    updates: Updates,
) -> Result<Vec<&'static str>, PushError> {
    if !caps.has_cap("report-status") {
        return Err(PushError::NoReportStatus);
    }
    let mut wanted = vec!["report-status"];
    if caps.has_cap("side-band-64k") {
        wanted.push("side-band-64k");
    }
    if commands.len() > 1 && updates == Updates::Atomic {
        if !caps.has_cap("atomic") {
            return Err(PushError::NoAtomic);
        }
        wanted.push("atomic");
    }
    if commands.iter().any(|c| c.new.is_null()) && !caps.has_cap("delete-refs") {
        return Err(PushError::NoDeleteRefs);
    }
    wanted.push(AGENT);
    Ok(wanted)
}

/// The body of a push: one line per command (the first with `caps`), a flush, the pack.
pub(crate) fn request(caps: &[&str], commands: &[Command], pack: Option<Vec<u8>>) -> Vec<u8> {
    let mut body = Vec::new();
    for (i, c) in commands.iter().enumerate() {
        let mut line = format!("{} {} {}", c.old, c.new, c.name).into_bytes();
        if i == 0 {
            line.push(0);
            line.extend_from_slice(caps.join(" ").as_bytes());
        }
        line.push(b'\n');
        pkt::write(&mut body, &line);
    }
    pkt::flush(&mut body);
    if let Some(pack) = pack {
        body.extend_from_slice(&pack);
    }
    body
}

/// The report-status of a push's `response`, out of side-band channel 1 when `sideband`.
pub(crate) fn report(response: &[u8], sideband: bool) -> Result<PushReport, PushError> {
    if sideband {
        let data = pkt::demux(&mut pkt::Reader::new(response), None)?;
        PushReport::parse(&data)
    } else {
        PushReport::parse(response)
    }
}
