//! pkt-line framing (git's wire format) and side-band demultiplexing.

use gix_packetline::{BandRef, PacketLineRef, decode};

use super::{Error, Framing};

/// Append one pkt-line holding `data`.
pub fn write(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(format!("{:04x}", data.len() + 4).as_bytes());
    out.extend_from_slice(data);
}

pub fn flush(out: &mut Vec<u8>) {
    out.extend_from_slice(b"0000");
}

/// Protocol v2's delimiter between a command's capabilities and its arguments.
pub fn delim(out: &mut Vec<u8>) {
    out.extend_from_slice(b"0001");
}

/// One frame of a pkt-line stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    Data(&'a [u8]),
    Flush,
    /// `0001` (delimiter) and `0002` (response end) of protocol v2; tolerated, never expected.
    Special,
}

/// Reads pkt-lines from a buffered response.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    /// The next frame, or `None` at the end of the input. Decoded by `gix-packetline`, which
    /// refuses what git's protocol does (lengths 3 and 4, lines over 65520 bytes, bad hex).
    pub fn next_frame(&mut self) -> Result<Option<Frame<'a>>, Error> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let decoded = decode::streaming(self.buf)
            .map_err(|e| Error::Framing(Framing::Invalid(e.probable_cause().to_string())))?;
        let (line, consumed) = match decoded {
            decode::Stream::Complete {
                line,
                bytes_consumed,
            } => (line, bytes_consumed),
            decode::Stream::Incomplete { .. } if self.buf.len() < 4 => {
                return Err(Error::Framing(Framing::TruncatedHeader));
            }
            decode::Stream::Incomplete { .. } => return Err(Error::Framing(Framing::Truncated)),
        };
        self.buf = &self.buf[consumed..];
        Ok(Some(match line {
            PacketLineRef::Data(data) => Frame::Data(data),
            PacketLineRef::Flush => Frame::Flush,
            PacketLineRef::Delimiter | PacketLineRef::ResponseEnd => Frame::Special,
        }))
    }

    /// The next data line with a trailing LF removed; `None` at a flush or the end.
    pub fn next_line(&mut self) -> Result<Option<&'a [u8]>, Error> {
        match self.next_frame()? {
            Some(Frame::Data(d)) => Ok(Some(d.strip_suffix(b"\n").unwrap_or(d))),
            Some(Frame::Flush | Frame::Special) | None => Ok(None),
        }
    }

    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }
}

/// Collect side-band channel 1 until a flush or the end; channel 2 is progress (dropped), channel
/// 3 a fatal error from the remote.
pub fn demux(reader: &mut Reader<'_>, first: Option<&[u8]>) -> Result<Vec<u8>, Error> {
    let mut data = Vec::new();
    let mut handle = |frame: &[u8]| -> Result<(), Error> {
        match PacketLineRef::Data(frame).decode_band() {
            Ok(BandRef::Data(payload)) => data.extend_from_slice(payload),
            Ok(BandRef::Progress(_)) => {}
            Ok(BandRef::Error(message)) => {
                return Err(Error::SideBand(
                    String::from_utf8_lossy(message).trim().to_owned(),
                ));
            }
            Err(_) => return Err(Error::Framing(Framing::NoChannel)),
        }
        Ok(())
    };
    if let Some(frame) = first {
        handle(frame)?;
    }
    while let Some(frame) = reader.next_frame()? {
        match frame {
            Frame::Data(d) => handle(d)?,
            Frame::Flush | Frame::Special => break,
        }
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut out = Vec::new();
        write(&mut out, b"hello\n");
        flush(&mut out);
        write(&mut out, b"x");
        assert_eq!(out, b"000ahello\n00000005x");
        let mut r = Reader::new(&out);
        assert_eq!(r.next_line().expect("ok"), Some(&b"hello"[..]));
        assert_eq!(r.next_frame().expect("ok"), Some(Frame::Flush));
        assert_eq!(r.next_frame().expect("ok"), Some(Frame::Data(b"x")));
        assert_eq!(r.next_frame().expect("ok"), None);
    }

    #[test]
    fn refuses_garbage() {
        for bad in [&b"00"[..], b"zzzz", b"0003", b"0009abc", b"0004", b"fff5"] {
            assert!(Reader::new(bad).next_frame().is_err(), "{bad:?}");
        }
        let framing = |bad: &[u8]| match Reader::new(bad).next_frame() {
            Err(Error::Framing(framing)) => framing,
            other => panic!("{bad:?}: {other:?}"),
        };
        assert!(matches!(framing(b"00"), Framing::TruncatedHeader));
        assert!(matches!(framing(b"0009abc"), Framing::Truncated));
        for bad in [&b"zzzz"[..], b"0003", b"0004", b"fff5"] {
            assert!(matches!(framing(bad), Framing::Invalid(_)), "{bad:?}");
        }
        assert_eq!(
            Error::Framing(framing(b"0003")).to_string(),
            "git protocol error: bad pkt-line: Received an invalid line of length 3"
        );
        // The longest line git allows: 65520 bytes with its header.
        let mut long = Vec::new();
        write(&mut long, &[b'a'; 65516]);
        assert!(
            matches!(Reader::new(&long).next_frame(), Ok(Some(Frame::Data(d))) if d.len() == 65516)
        );
        // Delimiter and response end of protocol v2.
        let mut reader = Reader::new(b"00010002");
        assert_eq!(reader.next_frame().expect("delim"), Some(Frame::Special));
        assert_eq!(reader.next_frame().expect("end"), Some(Frame::Special));
    }

    #[test]
    fn demux_channels() {
        let mut out = Vec::new();
        write(&mut out, b"\x01PA");
        write(&mut out, b"\x02progress");
        write(&mut out, b"\x01CK");
        flush(&mut out);
        assert_eq!(demux(&mut Reader::new(&out), None).expect("ok"), b"PACK");
        let mut err = Vec::new();
        write(&mut err, b"\x03boom");
        assert!(
            matches!(demux(&mut Reader::new(&err), None), Err(Error::SideBand(m)) if m == "boom")
        );
    }
}
