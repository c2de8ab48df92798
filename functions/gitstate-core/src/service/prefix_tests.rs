//! Version ids as any unique prefix of 7 or more hex digits: random histories whose ids share
//! prefixes on purpose, random prefix lengths 7..=40, against a model of which revisions each
//! selector names (unique, ambiguous, absent, and decimal prefixes that are also serials).

use std::sync::Arc;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Backend, Identity, MAX_PAGE, Repositories, Selector, ServiceError, WriteRequest};
use crate::access::Caller;
use crate::api::VersionInfo;
use crate::testing::MemoryStore;
use crate::{BranchName, ReadContext, StateName};

/// Outside any request.
static NO_REQUEST: ReadContext = ReadContext::no_request();

const HEX: &[u8] = b"0123456789abcdef";

fn random_hex(rng: &mut StdRng, n: usize) -> String {
    (0..n)
        .map(|_| char::from(HEX[rng.random_range(0..16)]))
        .collect()
}

/// `count` distinct 40-digit ids, many sharing a prefix of 7 to 39 digits with an earlier one,
/// some starting with 7 or more decimal digits (a serial's spelling, padded).
fn clustered_ids(rng: &mut StdRng, count: usize) -> Vec<String> {
    let mut ids: Vec<String> = Vec::with_capacity(count);
    while ids.len() < count {
        let id = match rng.random_range(0..4) {
            0 if !ids.is_empty() => {
                let base = &ids[rng.random_range(0..ids.len())];
                let shared = rng.random_range(7..40);
                format!("{}{}", &base[..shared], random_hex(rng, 40 - shared))
            }
            1 => {
                let serial = format!("{:07}", rng.random_range(1..6));
                format!("{serial}{}", random_hex(rng, 33))
            }
            _ => random_hex(rng, 40),
        };
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

fn backend(ids: Vec<String>) -> Backend {
    let ids = Arc::new(ids);
    let store = MemoryStore::with_version_ids(Arc::new(move |n| {
        ids.get(usize::try_from(n).unwrap_or(usize::MAX) - 1)
            .cloned()
            .unwrap_or_else(|| format!("{n:040x}"))
    }));
    let repos = Repositories {
        primary: "https://git.example/org/state.git".into(),
        default_branch: BranchName::parse("main").expect("valid"),
        allowed: vec![],
    };
    let identity = Identity {
        name: "gitstate".into(),
        email: "gitstate@localhost".into(),
    };
    Backend::new(Arc::new(store), repos, identity).with_unlocked_writes(true)
}

async fn all_revisions(b: &Backend, name: &StateName) -> Vec<VersionInfo> {
    let at = b.locate(None, None).expect("primary");
    let mut all = Vec::new();
    for page in 0.. {
        let (versions, more) = b
            .history(&Caller::operator("t"), &at, name, page, MAX_PAGE)
            .await
            .expect("history");
        all.extend(versions);
        if !more {
            return all;
        }
    }
    all
}

/// What the model says a selector text names: the revision, or why none.
#[derive(Debug, PartialEq)]
enum Expected {
    One(String),
    Ambiguous,
    /// A serial several revisions hold (this many).
    SharedSerial(usize),
    Absent,
    /// The selector names a removal: there is no content to read.
    Removed,
    Bad,
}

fn prefix_matches(text: &str, revisions: &[VersionInfo]) -> usize {
    revisions
        .iter()
        .filter(|v| v.version.starts_with(text))
        .count()
}

fn expected(text: &str, revisions: &[VersionInfo]) -> Expected {
    let hex = text.bytes().all(|b| b.is_ascii_hexdigit());
    let decimal = text.bytes().all(|b| b.is_ascii_digit());
    if text.is_empty() || !hex || (text.len() < 7 && !decimal) || text.len() > 40 {
        return Expected::Bad;
    }
    let text = text.to_ascii_lowercase();
    let by_serial = if decimal && text.len() < 20 {
        let serial: u64 = text.parse().expect("digits");
        let holders: Vec<&VersionInfo> = revisions
            .iter()
            .filter(|v| v.serial == Some(serial) && !v.deleted)
            .collect();
        match holders.as_slice() {
            [] => None,
            [one] => Some(one.version.clone()),
            // Unless the digits are also the start of several ids: that is answered first.
            _ if !(text.len() >= 7 && prefix_matches(&text, revisions) > 1) => {
                return Expected::SharedSerial(holders.len());
            }
            _ => None,
        }
    } else {
        None
    };
    if decimal && text.len() < 7 {
        return by_serial.map_or(Expected::Absent, Expected::One);
    }
    let by_prefix: Vec<&VersionInfo> = revisions
        .iter()
        .filter(|v| v.version.starts_with(&text))
        .collect();
    if text.len() == 40 {
        // A whole id is read as it is: a removal or an id of another state has no content.
        return match by_prefix.first() {
            Some(v) if !v.deleted => Expected::One(v.version.clone()),
            _ => Expected::Removed,
        };
    }
    match (by_prefix.as_slice(), by_serial) {
        ([_, _, ..], _) => Expected::Ambiguous,
        ([one], Some(serial)) if one.version != serial => Expected::Ambiguous,
        ([one], _) if one.deleted => Expected::Removed,
        ([one], _) => Expected::One(one.version.clone()),
        ([], Some(serial)) => Expected::One(serial),
        ([], None) => Expected::Absent,
    }
}

#[tokio::test]
async fn commit_id_prefixes_name_one_revision_or_say_why_not() {
    let seed = std::env::var("PREFIX_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("PREFIX_TEST_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut cases, mut seen) = (0, [0usize; 5]);
    for _history in 0..12 {
        let ids = clustered_ids(&mut rng, 60);
        let b = backend(ids.clone());
        let at = b.locate(None, None).expect("primary");
        let names: Vec<StateName> = ["a.tfstate", "b/c.tfstate"]
            .iter()
            .map(|n| StateName::parse(n).expect("valid"))
            .collect();
        // Random writes and removals over two states: each takes the next id.
        let mut serials = [1u64; 2];
        for _ in 0..rng.random_range(5..50) {
            let index = rng.random_range(0..names.len());
            let name = &names[index];
            let admin = Caller::operator("root");
            if rng.random_bool(0.15) {
                let _ = b.delete_state(&admin, &at, name, None, &NO_REQUEST).await;
            } else {
                // Serials never go down; repeats make one serial name several revisions.
                let serial = serials[index] + rng.random_range(0..2u64);
                serials[index] = serial;
                let body = format!(
                    r#"{{"version":4,"lineage":"l","serial":{serial},"n":{}}}"#,
                    rng.random::<u32>()
                );
                b.put_state(WriteRequest::new(
                    &admin,
                    &at,
                    name,
                    Bytes::from(body),
                    &NO_REQUEST,
                ))
                .await
                .expect("write");
            }
        }
        for name in &names {
            let revisions = all_revisions(&b, name).await;
            for _ in 0..60 {
                let text = match rng.random_range(0..6) {
                    // a prefix of one of this state's ids, or of any id (the other state's)
                    0..=2 if !revisions.is_empty() => {
                        let id = &revisions[rng.random_range(0..revisions.len())].version;
                        id[..rng.random_range(7..=40)].to_owned()
                    }
                    3 => {
                        let id = &ids[rng.random_range(0..ids.len())];
                        let prefix = &id[..rng.random_range(7..=40)];
                        if rng.random() {
                            prefix.to_ascii_uppercase()
                        } else {
                            prefix.to_owned()
                        }
                    }
                    // a serial, padded or not, and random hex (mostly absent, some too short)
                    4 => {
                        let serial = rng.random_range(0..7);
                        if rng.random() {
                            format!("{serial:07}")
                        } else {
                            serial.to_string()
                        }
                    }
                    _ => {
                        let len = rng.random_range(3..=41);
                        random_hex(&mut rng, len)
                    }
                };
                let want = expected(&text, &revisions);
                let got = match Selector::parse(&text) {
                    Err(ServiceError::BadSelector(_)) => Err("bad".to_owned()),
                    Err(other) => panic!("{text}: {other}"),
                    Ok(selector) => b
                        .get_version(&Caller::operator("t"), &at, name, &selector)
                        .await
                        .map(|(version, _)| version)
                        .map_err(|e| match e {
                            ServiceError::AmbiguousVersion { ref prefix, count } => {
                                assert_eq!(*prefix, text.to_ascii_lowercase());
                                assert!(count >= 2);
                                assert!(
                                    e.to_string().contains(prefix.as_str()),
                                    "the message names the prefix: {e}"
                                );
                                "ambiguous".to_owned()
                            }
                            ServiceError::SharedSerial { ref revisions, .. } => {
                                format!("shared {}", revisions.len())
                            }
                            ServiceError::NoSuchVersion(_) => "absent".to_owned(),
                            other => panic!("{text}: {other}"),
                        }),
                };
                let (index, ok) = match (&want, &got) {
                    (Expected::One(id), Ok(got)) => (0, id == got),
                    (Expected::Ambiguous, Err(e)) => (1, e == "ambiguous"),
                    (Expected::SharedSerial(n), Err(e)) => (1, *e == format!("shared {n}")),
                    (Expected::Absent | Expected::Removed, Err(e)) => (2, e == "absent"),
                    (Expected::Bad, Err(e)) => (3, e == "bad"),
                    _ => (4, false),
                };
                assert!(
                    ok,
                    "{name} {text}: expected {want:?}, got {got:?} (seed {seed})"
                );
                seen[index] += 1;
                cases += 1;
            }
        }
    }
    println!(
        "{cases} selectors: one {}, ambiguous {}, absent or removed {}, bad {}",
        seen[0], seen[1], seen[2], seen[3]
    );
    assert!(
        seen[..4].iter().all(|n| *n > 0),
        "every class ran: {seen:?}"
    );
}

#[test]
fn selectors_parse_by_length_and_digits() {
    use Selector as S;
    let p = |t: &str| Selector::parse(t);
    assert_eq!(p("12").ok(), Some(S::Serial(12)));
    assert_eq!(p("123456").ok(), Some(S::Serial(123_456)));
    assert_eq!(
        p("1234567").ok(),
        Some(S::SerialOrPrefix(1_234_567, "1234567".into()))
    );
    assert_eq!(p("ABCDEF1").ok(), Some(S::Prefix("abcdef1".into())));
    assert!(matches!(p("abcdef"), Err(ServiceError::BadSelector(_))));
    assert!(matches!(p(""), Err(ServiceError::BadSelector(_))));
    assert!(matches!(p("xyz1234"), Err(ServiceError::BadSelector(_))));
    assert!(matches!(
        p(&"a".repeat(41)),
        Err(ServiceError::BadSelector(_))
    ));
    assert_eq!(p(&"A".repeat(40)).ok(), Some(S::Version("a".repeat(40))));
    assert_eq!(p(&"1".repeat(25)).ok(), Some(S::Prefix("1".repeat(25))));
}
