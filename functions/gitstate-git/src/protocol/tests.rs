use gix::ObjectId;

use crate::RemoteError;
use crate::transport;

use super::fetch::{FetchError, fetch_capabilities, pack_of};
use super::{
    AGENT, Advert, Command, PushError, PushReport, Service, Updates, pkt, push_capabilities,
};

fn advert_body(lines: &[&[u8]]) -> Vec<u8> {
    let mut body = Vec::new();
    pkt::write(&mut body, b"# service=git-receive-pack\n");
    pkt::flush(&mut body);
    for line in lines {
        pkt::write(&mut body, line);
    }
    pkt::flush(&mut body);
    body
}

#[test]
fn parses_advertisements() {
    let a = "1111111111111111111111111111111111111111";
    let body = advert_body(&[
        format!("{a} refs/heads/main\0report-status delete-refs atomic side-band-64k\n").as_bytes(),
        format!("{a} refs/heads/locks/x.tfstate\n").as_bytes(),
    ]);
    let advert = Advert::parse(&body, Service::ReceivePack).expect("valid");
    assert!(advert.has_cap("atomic") && !advert.has_cap("thin-pack"));
    assert_eq!(advert.refs.len(), 2);
    assert_eq!(
        advert.tip("refs/heads/main").map(|o| o.to_string()),
        Some(a.to_owned())
    );
}

#[test]
fn parses_empty_repository() {
    let zero = "0000000000000000000000000000000000000000";
    let body = advert_body(&[format!("{zero} capabilities^{{}}\0report-status\n").as_bytes()]);
    let advert = Advert::parse(&body, Service::ReceivePack).expect("valid");
    assert!(advert.refs.is_empty() && advert.has_cap("report-status"));
}

#[test]
fn refuses_dumb_servers() {
    assert!(Advert::parse(b"1111111 refs/heads/main\n", Service::UploadPack).is_err());
}

/// A ref line that cannot be read is a protocol error with the text it had before reading an
/// advertisement had its own error: not transient, the remote's fault (502).
#[test]
fn malformed_advertisements_are_protocol_errors() {
    let zero = "0".repeat(40);
    for (line, text) in [
        (
            b"\xff\xfe refs/heads/main\n".to_vec(),
            "ref advertisement is not UTF-8",
        ),
        (format!("{zero}\n").into_bytes(), "malformed ref line"),
        (b"zz refs/heads/main\n".to_vec(), "malformed object id"),
    ] {
        let error = RemoteError::from(
            Advert::parse(&advert_body(&[&line]), Service::ReceivePack).expect_err(text),
        );
        assert_eq!(error.to_string(), format!("git protocol error: {text}"));
        assert!(
            matches!(error, RemoteError::Advert(_))
                && error.garbled()
                && !error.refused()
                && !error.is_transient(),
            "{text}"
        );
    }
}

/// A ref named twice in one push: each command takes its own verdict, in order.
#[test]
fn verdicts_follow_the_order_of_commands() {
    let id = |n: u8| ObjectId::from_bytes_or_panic(&[n; 20]);
    let command = |name: &str, old: u8, new: u8| Command {
        old: id(old),
        new: id(new),
        name: name.to_owned(),
    };
    let commands = [
        command("refs/a", 0, 1),
        command("refs/b", 0, 1),
        command("refs/a", 1, 0),
        command("refs/c", 2, 2),
    ];
    let mut data = Vec::new();
    pkt::write(&mut data, b"unpack ok\n");
    pkt::write(&mut data, b"ok refs/a\n");
    pkt::write(&mut data, b"ng refs/b failed to update ref\n");
    pkt::write(&mut data, b"ng refs/a failed to update ref\n");
    pkt::flush(&mut data);
    let report = PushReport::parse(&data).expect("valid");
    assert_eq!(report.verdicts(&commands), [true, false, false, false]);
    let mut data = Vec::new();
    pkt::write(&mut data, b"unpack ok\n");
    pkt::write(&mut data, b"ng refs/a failed to update ref\n");
    pkt::write(&mut data, b"ok refs/a\n");
    pkt::flush(&mut data);
    let report = PushReport::parse(&data).expect("valid");
    assert_eq!(report.verdicts(&commands), [false, false, true, false]);
}

#[test]
fn parses_report_status() {
    let mut data = Vec::new();
    pkt::write(&mut data, b"unpack ok\n");
    pkt::write(&mut data, b"ok refs/heads/main\n");
    pkt::write(&mut data, b"ng refs/heads/locks/a failed to update ref\n");
    pkt::flush(&mut data);
    let report = PushReport::parse(&data).expect("valid");
    assert_eq!(report.refs[0], ("refs/heads/main".into(), Ok(())));
    assert_eq!(
        report.refs[1],
        (
            "refs/heads/locks/a".into(),
            Err("failed to update ref".into())
        )
    );
    let mut bad = Vec::new();
    pkt::write(&mut bad, b"unpack index-pack failed\n");
    assert!(matches!(PushReport::parse(&bad), Err(PushError::Unpack(_))));
    assert!(matches!(
        PushReport::parse(&bad).map_err(RemoteError::from),
        Err(error @ RemoteError::Push(PushError::Unpack(_))) if error.refused() && error.is_transient()
    ));
}

/// Every way a push has no verdict reads as it did before pushing had its own error: the
/// remote's refusals are `refused` (transient), the rest `garbled`, both the remote's fault
/// (502); the wire's own errors pass through unchanged.
#[test]
fn push_errors_keep_their_texts_and_kinds() {
    use gitstate_core::ports::StoreError;
    let cases = [
        (
            PushError::NoReportStatus,
            "git protocol error: the remote does not offer report-status, so a push's outcome could not be known",
        ),
        (
            PushError::NoAtomic,
            "git protocol error: several ref updates in one push need atomic, which the remote does not offer",
        ),
        (
            PushError::NoDeleteRefs,
            "git remote reports: the remote does not allow deleting refs",
        ),
        (
            PushError::EmptyReport,
            "git protocol error: empty report-status",
        ),
        (
            PushError::Unpack("index-pack failed".into()),
            "git remote reports: the remote could not unpack: index-pack failed",
        ),
        (
            PushError::NoUnpack,
            "git protocol error: report-status does not start with 'unpack'",
        ),
        (
            PushError::UnexpectedLine("what".into()),
            "git protocol error: unexpected report-status line \"what\"",
        ),
        (
            PushError::Wire(transport::Error::Status {
                status: 403,
                what: "push",
            }),
            "git remote answered HTTP 403 to the push",
        ),
    ];
    for (error, text) in cases {
        let refused = error.refused();
        let garbled = error.garbled();
        let error = RemoteError::from(error);
        assert_eq!(error.to_string(), text);
        assert_eq!(error.is_transient(), refused, "{text}");
        assert_eq!(error.refused(), refused, "{text}");
        assert_eq!(error.garbled(), garbled, "{text}");
        assert!(matches!(error, RemoteError::Push(_)), "{text}");
        // Each is the remote's refusal, an answer that is not a report, or an HTTP status.
        assert_eq!(
            u8::from(refused) + u8::from(garbled) + u8::from(error.status().is_some()),
            1,
            "{text}"
        );
        assert!(
            matches!(StoreError::from(error), StoreError::Remote(_)),
            "{text}"
        );
    }
    // What the store's floor decides on (a push answered without a report): `garbled`.
    let mut empty = Vec::new();
    pkt::flush(&mut empty);
    assert!(matches!(
        PushReport::parse(&empty).map_err(RemoteError::from),
        Err(error @ RemoteError::Push(PushError::EmptyReport)) if error.garbled()
    ));
}

const PUSH_CAPS: [&str; 10] = [
    "report-status",
    "report-status-v2",
    "delete-refs",
    "side-band-64k",
    "quiet",
    "atomic",
    "ofs-delta",
    "push-options",
    "object-format=sha1",
    "agent=git/2.43.0",
];

/// Every subset of capabilities a receive-pack could advertise, with one to three commands
/// (creates, updates, deletes): a push asks only for what was advertised, never for what it
/// does not use, and refuses exactly when a needed capability is missing.
#[test]
fn push_asks_only_for_advertised_capabilities() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(14);
    let id = |n: u8| ObjectId::from_bytes_or_panic(&[n; 20]);
    for mask in 0u32..(1 << PUSH_CAPS.len()) {
        let caps = Advert {
            caps: (0..PUSH_CAPS.len())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| PUSH_CAPS[i].to_owned())
                .collect(),
            ..Advert::default()
        };
        let commands: Vec<Command> = (0..rng.random_range(1..=3))
            .map(|i| Command {
                old: if rng.random_bool(0.3) { null() } else { id(1) },
                new: if rng.random_bool(0.3) { null() } else { id(2) },
                name: format!("refs/heads/r{i}"),
            })
            .collect();
        let deletes = commands.iter().any(|c| c.new.is_null());
        let updates = if rng.random_bool(0.5) {
            Updates::Atomic
        } else {
            Updates::EachAlone
        };
        let together = commands.len() > 1 && updates == Updates::Atomic;
        let possible = caps.has_cap("report-status")
            && (!together || caps.has_cap("atomic"))
            && (!deletes || caps.has_cap("delete-refs"));
        match push_capabilities(&caps, &commands, updates) {
            Ok(wanted) => {
                assert!(possible, "{caps:?} {commands:?}");
                for cap in wanted.iter().filter(|c| !c.starts_with("agent=")) {
                    assert!(caps.has_cap(cap), "asked for {cap} not in {caps:?}");
                    assert!(
                        !["report-status-v2", "quiet", "push-options", "ofs-delta"].contains(cap),
                        "asked for unused {cap}"
                    );
                }
                assert_eq!(wanted.contains(&"atomic"), together);
                assert_eq!(
                    wanted.contains(&"side-band-64k"),
                    caps.has_cap("side-band-64k")
                );
            }
            Err(_) => assert!(!possible, "{caps:?} {commands:?}"),
        }
    }
}

fn null() -> ObjectId {
    ObjectId::null(gix::hash::Kind::Sha1)
}

#[test]
fn fetch_asks_only_for_advertised_capabilities() {
    let all = [
        "side-band-64k",
        "ofs-delta",
        "shallow",
        "no-progress",
        "filter",
    ];
    for mask in 0u32..(1 << all.len()) {
        let caps: Vec<String> = (0..all.len())
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| all[i].to_owned())
            .collect();
        for partial in [false, true] {
            let wanted = fetch_capabilities(Some(&caps), partial);
            for cap in wanted.iter().filter(|c| !c.starts_with("agent=")) {
                assert!(caps.iter().any(|c| c == cap), "{cap} not in {caps:?}");
            }
            // `filter` only for a partial fetch, and then whenever offered.
            assert_eq!(
                wanted.len(),
                1 + caps.iter().filter(|c| partial || *c != "filter").count()
            );
        }
    }
    for partial in [false, true] {
        assert_eq!(
            fetch_capabilities(None, partial),
            [AGENT],
            "nothing optional unadvertised"
        );
    }
}

/// A fetch's failures read as they did before fetching had its own error: the remote's `ERR`
/// and a side-band error are `refused` (transient: the store looks again), no pack `garbled`;
/// all the remote's fault (502).
#[test]
fn fetch_errors_keep_their_texts_and_kinds() {
    use gitstate_core::ports::StoreError;
    let mut err = Vec::new();
    pkt::write(&mut err, b"NAK\n");
    pkt::write(&mut err, b"ERR upload-pack: not our ref 1111\n");
    let mut sideband = Vec::new();
    pkt::write(&mut sideband, b"\x03fatal: gone\n");
    let mut none = Vec::new();
    pkt::write(&mut none, b"NAK\n");
    pkt::flush(&mut none);
    let cases = [
        (
            &err,
            "git remote reports: upload-pack: not our ref 1111",
            true,
        ),
        (&sideband, "git remote reports: fatal: gone", true),
        (
            &none,
            "git protocol error: the fetch response has no pack",
            false,
        ),
    ];
    for (response, text, transient) in cases {
        let error = pack_of(response).expect_err(text);
        assert_eq!(matches!(error, FetchError::Refused(_)), response == &err);
        let error = RemoteError::from(error);
        assert_eq!(error.to_string(), text);
        assert_eq!(error.is_transient(), transient, "{text}");
        assert_eq!(error.refused(), transient, "{text}");
        assert_eq!(error.garbled(), !transient, "{text}");
        assert!(matches!(error, RemoteError::Fetch(_)), "{text}");
        assert!(
            matches!(StoreError::from(error), StoreError::Remote(_)),
            "{text}"
        );
    }
}
