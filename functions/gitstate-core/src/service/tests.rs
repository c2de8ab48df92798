use super::*;
use crate::access::Grant;
use crate::testing::MemoryStore;
use std::sync::atomic::Ordering::SeqCst;

/// Outside any request.
static NO_REQUEST: ReadContext = ReadContext::no_request();

fn admin() -> Caller {
    Caller::operator("root")
}

fn writer(name: &str) -> Caller {
    Caller::new(name, vec![Grant::parse("write:net/").expect("valid")])
}

fn backend() -> (Backend, Location, StateName) {
    let repos = Repositories {
        primary: "https://git.example/org/state.git".into(),
        default_branch: BranchName::parse("main").expect("valid"),
        allowed: vec!["https://git.example/org/other".into()],
    };
    let identity = Identity {
        name: "gitstate".into(),
        email: "gitstate@localhost".into(),
    };
    // Setup writes here hold no lock; the lock rule itself is `unlocked_writes_need_the_setting`.
    let backend =
        Backend::new(Arc::new(MemoryStore::default()), repos, identity).with_unlocked_writes(true);
    let at = backend.locate(None, None).expect("primary");
    (
        backend,
        at,
        StateName::parse("net/prod.tfstate").expect("valid"),
    )
}

fn lock_body(id: &str) -> Bytes {
    Bytes::from(format!(
        r#"{{"ID":"{id}","Operation":"OperationTypeApply","Who":"me@host"}}"#
    ))
}

fn state(lineage: &str, serial: u64) -> Bytes {
    Bytes::from(format!(
        r#"{{"version":4,"lineage":"{lineage}","serial":{serial}}}"#
    ))
}

#[tokio::test]
async fn lock_is_exclusive_and_idempotent() {
    // GIVEN a lock held by A
    let (b, at, name) = backend();
    b.lock(&admin(), &at, &name, lock_body("A"))
        .await
        .expect("first lock");
    // WHEN A locks again, THEN it succeeds; WHEN B locks, THEN it sees A
    b.lock(&admin(), &at, &name, lock_body("A"))
        .await
        .expect("same ID again");
    match b.lock(&admin(), &at, &name, lock_body("B")).await {
        Err(ServiceError::Locked(held)) => assert_eq!(held.info.id(), "A"),
        other => panic!("expected Locked, got {other:?}"),
    }
}

#[tokio::test]
async fn unlock_rules() {
    let (b, at, name) = backend();
    b.unlock(&admin(), &at, &name, b"")
        .await
        .expect("unlocking nothing is fine");
    b.lock(&admin(), &at, &name, lock_body("A"))
        .await
        .expect("lock");
    assert!(matches!(
        b.unlock(&admin(), &at, &name, &lock_body("B")).await,
        Err(ServiceError::LockMismatch(_))
    ));
    b.unlock(&admin(), &at, &name, &lock_body("A"))
        .await
        .expect("holder unlocks");
    b.lock(&admin(), &at, &name, lock_body("C"))
        .await
        .expect("lock again");
    b.unlock(&admin(), &at, &name, b"")
        .await
        .expect("force-unlock");
    assert!(matches!(
        b.get_lock(&admin(), &at, &name).await,
        Err(ServiceError::NoLock)
    ));
}

#[tokio::test]
async fn write_rules() {
    let (b, at, name) = backend();
    b.put_state(WriteRequest::new(
        &admin(),
        &at,
        &name,
        state("L", 1),
        &NO_REQUEST,
    ))
    .await
    .expect("unlocked write without ID");
    assert!(matches!(
        b.put_state(
            WriteRequest::new(&admin(), &at, &name, state("L", 2), &NO_REQUEST).lock_id(Some("X"))
        )
        .await,
        Err(ServiceError::NotLocked { .. })
    ));
    b.lock(&admin(), &at, &name, lock_body("A"))
        .await
        .expect("lock");
    assert!(matches!(
        b.put_state(WriteRequest::new(
            &admin(),
            &at,
            &name,
            state("L", 2),
            &NO_REQUEST
        ))
        .await,
        Err(ServiceError::Locked(_))
    ));
    assert!(matches!(
        b.put_state(
            WriteRequest::new(&admin(), &at, &name, state("L", 2), &NO_REQUEST).lock_id(Some("B"))
        )
        .await,
        Err(ServiceError::LockMismatch(_))
    ));
    b.put_state(
        WriteRequest::new(&admin(), &at, &name, state("L", 3), &NO_REQUEST).lock_id(Some("A")),
    )
    .await
    .expect("holder writes");
    assert!(matches!(
        b.put_state(
            WriteRequest::new(&admin(), &at, &name, state("L", 2), &NO_REQUEST).lock_id(Some("A"))
        )
        .await,
        Err(ServiceError::Stale { stored: 3, sent: 2 })
    ));
    b.put_state(
        WriteRequest::new(&admin(), &at, &name, state("other-lineage", 1), &NO_REQUEST)
            .lock_id(Some("A")),
    )
    .await
    .expect("new lineage");
    b.put_state(
        WriteRequest::new(
            &admin(),
            &at,
            &name,
            Bytes::from_static(b"{\"encrypted_data\":\"x\"}"),
            &NO_REQUEST,
        )
        .lock_id(Some("A")),
    )
    .await
    .expect("no serial");
    assert!(matches!(
        b.put_state(
            WriteRequest::new(&admin(), &at, &name, Bytes::from_static(b"[]"), &NO_REQUEST)
                .lock_id(Some("A"))
        )
        .await,
        Err(ServiceError::InvalidState(_))
    ));
    assert_eq!(
        b.get_state(&admin(), &at, &name, &NO_REQUEST)
            .await
            .expect("stored")
            .as_ref(),
        b"{\"encrypted_data\":\"x\"}"
    );
}

/// Without the setting, every write and delete that holds no lock is refused while nobody holds
/// the lock (and changes nothing); with it, each goes through. A held lock refuses either way.
#[tokio::test]
async fn unlocked_writes_need_the_setting() {
    for allowed in [false, true] {
        for stored in [false, true] {
            for delete in [false, true] {
                for held in [false, true] {
                    let (b, at, name) = backend();
                    if stored {
                        b.put_state(WriteRequest::new(
                            &admin(),
                            &at,
                            &name,
                            state("L", 1),
                            &NO_REQUEST,
                        ))
                        .await
                        .expect("setup");
                    }
                    if held {
                        b.lock(&admin(), &at, &name, lock_body("A"))
                            .await
                            .expect("lock");
                    }
                    let b = b.with_unlocked_writes(allowed);
                    let before = b.get_state(&admin(), &at, &name, &NO_REQUEST).await.ok();
                    let answer = if delete {
                        b.delete_state(&admin(), &at, &name, None, &NO_REQUEST)
                            .await
                    } else {
                        b.put_state(WriteRequest::new(
                            &admin(),
                            &at,
                            &name,
                            state("L", 2),
                            &NO_REQUEST,
                        ))
                        .await
                    };
                    let case =
                        format!("allowed={allowed} stored={stored} delete={delete} held={held}");
                    match answer {
                        Err(ServiceError::Locked(_)) => assert!(held, "{case}"),
                        Err(ServiceError::Unlocked) => assert!(!held && !allowed, "{case}"),
                        Err(ServiceError::NotFound) => {
                            assert!(delete && !stored && allowed && !held, "{case}")
                        }
                        Ok(()) => assert!(allowed && !held, "{case}"),
                        other => panic!("{case}: {other:?}"),
                    }
                    if !allowed || held {
                        let after = b.get_state(&admin(), &at, &name, &NO_REQUEST).await.ok();
                        assert_eq!(before, after, "{case}: nothing changed");
                    }
                }
            }
        }
    }
}

/// A branch is never created by accident: the first branch of an empty repository is, a second
/// one only with the setting; a missing branch reads as an error naming the setting, never as
/// "no state".
#[tokio::test]
async fn missing_branches_beside_others_are_refused() {
    let (b, at, name) = backend();
    let dev = Location {
        branch: BranchName::parse("dev").expect("valid"),
        ..at.clone()
    };
    assert!(matches!(
        b.get_state(&admin(), &at, &name, &NO_REQUEST).await,
        Err(ServiceError::NotFound)
    ));
    b.put_state(WriteRequest::new(
        &admin(),
        &at,
        &name,
        state("L", 1),
        &NO_REQUEST,
    ))
    .await
    .expect("the empty repository's first branch");
    let refused = |r: Result<_, ServiceError>| match r {
        Err(ServiceError::NoBranch {
            branch, setting, ..
        }) => {
            assert_eq!((branch.as_str(), setting), ("dev", "the address's ?ref="));
        }
        other => panic!("{other:?}"),
    };
    refused(
        b.get_state(&admin(), &dev, &name, &NO_REQUEST)
            .await
            .map(|_| ()),
    );
    refused(
        b.put_state(WriteRequest::new(
            &admin(),
            &dev,
            &name,
            state("L", 1),
            &NO_REQUEST,
        ))
        .await,
    );
    let b = b.with_branch_creation(true);
    b.put_state(WriteRequest::new(
        &admin(),
        &dev,
        &name,
        state("L", 1),
        &NO_REQUEST,
    ))
    .await
    .expect("created with the setting");
    b.get_state(&admin(), &dev, &name, &NO_REQUEST)
        .await
        .expect("there");
}

/// `GITSTATE_CREATE_REF` creates the configured branch only while no other branch holds states:
/// a typo in `GITSTATE_REF` reads and writes as a 400 naming the branches that do. An
/// allowlisted `?ref=` is still created beside them.
#[tokio::test]
async fn the_setting_never_starts_the_configured_branch_beside_states() {
    let (first, _, name) = backend();
    let store = first.store().clone();
    let dev = Location {
        branch: BranchName::parse("dev").expect("valid"),
        ..first.locate(None, None).expect("primary")
    };
    first
        .put_state(WriteRequest::new(
            &admin(),
            &dev,
            &name,
            state("L", 1),
            &NO_REQUEST,
        ))
        .await
        .expect("the empty repository's first branch");
    let repos = Repositories {
        primary: "https://git.example/org/state.git".into(),
        default_branch: BranchName::parse("mian").expect("valid"),
        allowed: vec![],
    };
    let identity = Identity {
        name: "gitstate".into(),
        email: "gitstate@localhost".into(),
    };
    let typo = Backend::new(store, repos, identity)
        .with_unlocked_writes(true)
        .with_branch_creation(true);
    let at = typo.locate(None, None).expect("primary");
    let refused = |r: Result<(), ServiceError>| match r {
        Err(e @ ServiceError::BranchBesideStates { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("\"mian\"") && text.contains("\"dev\""),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    };
    refused(
        typo.get_state(&admin(), &at, &name, &NO_REQUEST)
            .await
            .map(|_| ()),
    );
    refused(
        typo.put_state(WriteRequest::new(
            &admin(),
            &at,
            &name,
            state("L", 2),
            &NO_REQUEST,
        ))
        .await,
    );
    let qa = Location {
        branch: BranchName::parse("qa").expect("valid"),
        ..at.clone()
    };
    typo.put_state(WriteRequest::new(
        &admin(),
        &qa,
        &name,
        state("L", 1),
        &NO_REQUEST,
    ))
    .await
    .expect("another branch than the configured one is created beside states");
}

#[tokio::test]
async fn delete_requires_existing_state() {
    let (b, at, name) = backend();
    assert!(matches!(
        b.delete_state(&admin(), &at, &name, None, &NO_REQUEST)
            .await,
        Err(ServiceError::NotFound)
    ));
    b.put_state(WriteRequest::new(
        &admin(),
        &at,
        &name,
        state("L", 1),
        &NO_REQUEST,
    ))
    .await
    .expect("write");
    b.delete_state(&admin(), &at, &name, None, &NO_REQUEST)
        .await
        .expect("delete");
    assert!(matches!(
        b.get_state(&admin(), &at, &name, &NO_REQUEST).await,
        Err(ServiceError::NotFound)
    ));
}

#[test]
fn allowlist() {
    let (b, _, _) = backend();
    assert!(matches!(
        b.locate(None, Some("dev")),
        Err(ServiceError::RefNotAllowed(_))
    ));
    let refs = crate::refs::AllowedRefs::parse("dev").expect("valid");
    let policy = RefPolicy::new(
        BranchName::parse("main").expect("valid"),
        crate::refs::DEFAULT_LOCK_PREFIX,
        refs,
    )
    .expect("valid");
    let b = b.with_refs(policy);
    assert!(
        b.locate(Some("https://git.example/org/other.git/"), Some("dev"))
            .is_ok()
    );
    assert!(matches!(
        b.locate(None, Some("locks/net/prod.tfstate")),
        Err(ServiceError::RefNotAllowed(_))
    ));
    assert!(
        b.locate(Some("https://git.example/org/state"), None)
            .is_ok()
    );
    assert!(matches!(
        b.locate(Some("https://evil.example/x"), None),
        Err(ServiceError::RepositoryNotAllowed(_))
    ));
    assert!(matches!(
        b.locate(None, Some("a..b")),
        Err(ServiceError::Branch(_))
    ));
}

#[tokio::test]
async fn writers_release_only_their_own_locks() {
    let (b, at, name) = backend();
    b.lock(&writer("ann"), &at, &name, lock_body("A"))
        .await
        .expect("ann locks");
    match b.unlock(&writer("bob"), &at, &name, &lock_body("A")).await {
        Err(ServiceError::Forbidden(denied)) => assert_eq!(denied.role, Role::Admin),
        other => panic!("bob must not release ann's lock: {other:?}"),
    }
    assert!(
        matches!(
            b.unlock(&writer("ann"), &at, &name, b"").await,
            Err(ServiceError::Forbidden(_))
        ),
        "force-unlock takes admin, even for the owner"
    );
    b.unlock(&writer("ann"), &at, &name, &lock_body("A"))
        .await
        .expect("ann releases her own lock");
    b.lock(&writer("ann"), &at, &name, lock_body("B"))
        .await
        .expect("lock again");
    b.unlock(&admin(), &at, &name, b"")
        .await
        .expect("admin force-unlocks");
    let outside = StateName::parse("app/x.tfstate").expect("valid");
    assert!(matches!(
        b.get_state(&writer("ann"), &at, &outside, &NO_REQUEST)
            .await,
        Err(ServiceError::Forbidden(_))
    ));
    assert!(matches!(
        b.delete_state(&writer("ann"), &at, &name, None, &NO_REQUEST)
            .await,
        Err(ServiceError::Forbidden(_))
    ));
}

#[tokio::test]
async fn commits_are_authored_by_the_user() {
    let store = Arc::new(MemoryStore::default());
    let b = Backend::new(
        store.clone(),
        Repositories {
            primary: "r".into(),
            default_branch: BranchName::parse("main").expect("valid"),
            allowed: Vec::new(),
        },
        Identity {
            name: "gitstate".into(),
            email: "gitstate@localhost".into(),
        },
    );
    let at = b.locate(None, None).expect("primary");
    let name = StateName::parse("net/a.tfstate").expect("valid");
    b.lock(&writer("ann"), &at, &name, lock_body("A"))
        .await
        .expect("lock");
    b.put_state(
        WriteRequest::new(&writer("ann"), &at, &name, state("L", 1), &NO_REQUEST)
            .lock_id(Some("A")),
    )
    .await
    .expect("write");
    let history = store.history();
    assert!(history.iter().all(|c| c.author_name == "ann"));
    assert!(history.iter().all(|c| c.message.contains("User: ann\n")));
    let held = b.get_lock(&admin(), &at, &name).await.expect("held");
    assert_eq!(held.owner.as_deref(), Some("ann"));
}

/// Every operation on a name that lies below a state or is a folder of states is 409 and
/// changes nothing, in the memory store as in git; a held lock can always be released.
#[tokio::test]
async fn names_that_clash_with_the_tree_are_refused() {
    for (existing, clashing) in [
        ("a", "a/b.tfstate"),
        ("a/b", "a/b/c/d.tfstate"),
        ("team/app/prod.tfstate", "team/app"),
        ("team/app/prod.tfstate", "team"),
    ] {
        let (b, at, _) = backend();
        let existing = StateName::parse(existing).expect("valid");
        let name = StateName::parse(clashing).expect("valid");
        b.put_state(WriteRequest::new(
            &admin(),
            &at,
            &existing,
            state("L", 1),
            &NO_REQUEST,
        ))
        .await
        .expect("first state");
        let before = b.store().list_states(&at, "").await.expect("list");
        let is_clash = |r: Result<(), ServiceError>| matches!(r, Err(ServiceError::Clash(_)));
        assert!(is_clash(
            b.put_state(WriteRequest::new(
                &admin(),
                &at,
                &name,
                state("M", 1),
                &NO_REQUEST
            ))
            .await
        ));
        assert!(is_clash(b.lock(&admin(), &at, &name, lock_body("X")).await));
        assert!(is_clash(
            b.unlock(&admin(), &at, &name, &lock_body("X")).await
        ));
        assert!(is_clash(
            b.delete_state(&admin(), &at, &name, None, &NO_REQUEST)
                .await
        ));
        assert!(matches!(
            b.restore(&admin(), &at, &name, &Selector::Serial(1), &NO_REQUEST)
                .await,
            Err(ServiceError::Clash(_))
        ));
        assert_eq!(b.store().list_states(&at, "").await.expect("list"), before);
        assert!(b.list_locks(&admin(), &at).await.expect("locks").is_empty());
    }
}

/// A 409 names the state in the way only to a caller who may read it: every pair of names
/// over {a, b} up to three deep where one is a folder of the other, as a state in the tree
/// and as a held lock, met by a caller whose only grant is `admin:<its own name>`.
#[tokio::test]
async fn clashes_name_only_states_the_caller_may_read() {
    let mut names = vec![String::new()];
    for _ in 0..3 {
        let longer: Vec<String> = names
            .iter()
            .flat_map(|n| {
                ["a", "b"].map(|s| format!("{n}{}{s}", if n.is_empty() { "" } else { "/" }))
            })
            .collect();
        names.extend(longer);
    }
    names.retain(|n| !n.is_empty());
    let mut pairs = 0;
    for existing in &names {
        for clashing in &names {
            let below = |a: &str, b: &str| a.starts_with(&format!("{b}/"));
            if !below(existing, clashing) && !below(clashing, existing) {
                continue;
            }
            pairs += 1;
            let caller = Caller::new(
                "ops",
                vec![Grant::parse(&format!("admin:{clashing}")).expect("valid")],
            );
            let readable = existing.starts_with(clashing.as_str());
            let told = |r: Result<(), ServiceError>, what: &str| match r {
                Err(ServiceError::Clash(Clash::Unreadable)) => assert!(!readable, "{what}"),
                Err(ServiceError::Clash(
                    Clash::BelowState(o) | Clash::Folder(o) | Clash::LockRef(o),
                )) => assert!(readable && o == *existing, "{what}: {o}"),
                other => panic!("{what}: {other:?}"),
            };
            let what = format!("{clashing} against {existing}");
            let existing = StateName::parse(existing).expect("valid");
            let name = StateName::parse(clashing).expect("valid");
            // in the tree
            let (b, at, _) = backend();
            b.put_state(WriteRequest::new(
                &admin(),
                &at,
                &existing,
                state("L", 1),
                &NO_REQUEST,
            ))
            .await
            .expect("first state");
            told(
                b.put_state(WriteRequest::new(
                    &caller,
                    &at,
                    &name,
                    state("M", 1),
                    &NO_REQUEST,
                ))
                .await,
                &what,
            );
            told(b.lock(&caller, &at, &name, lock_body("X")).await, &what);
            told(b.unlock(&caller, &at, &name, &lock_body("X")).await, &what);
            told(
                b.delete_state(&caller, &at, &name, None, &NO_REQUEST).await,
                &what,
            );
            told(
                b.restore(&caller, &at, &name, &Selector::Serial(1), &NO_REQUEST)
                    .await
                    .map(drop),
                &what,
            );
            // as a held lock
            let (b, at, _) = backend();
            b.lock(&admin(), &at, &existing, lock_body("E"))
                .await
                .expect("lock");
            told(b.lock(&caller, &at, &name, lock_body("X")).await, &what);
        }
    }
    assert!(pairs > 20, "{pairs} pairs");
}

#[tokio::test]
async fn lock_refs_that_clash_are_refused_and_held_locks_released() {
    let (b, at, _) = backend();
    let child = StateName::parse("a/b.tfstate").expect("valid");
    let parent = StateName::parse("a").expect("valid");
    b.lock(&admin(), &at, &child, lock_body("C"))
        .await
        .expect("lock");
    match b.lock(&admin(), &at, &parent, lock_body("P")).await {
        Err(ServiceError::Clash(Clash::LockRef(other))) => assert_eq!(other, "a/b.tfstate"),
        other => panic!("expected a lock clash, got {other:?}"),
    }
    b.unlock(&admin(), &at, &child, &lock_body("C"))
        .await
        .expect("unlock");
    b.lock(&admin(), &at, &parent, lock_body("P"))
        .await
        .expect("lock parent");
    assert!(matches!(
        b.lock(&admin(), &at, &child, lock_body("C")).await,
        Err(ServiceError::Clash(Clash::LockRef(_)))
    ));
}

/// A write that would create its branch next to an existing branch it clashes with (one a
/// path prefix of the other) is 409 naming that branch, and creates nothing; seeded random
/// branch pairs over a small alphabet, so that clashes are frequent.
#[tokio::test]
async fn branches_that_clash_are_refused_generated() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(44);
    let mut random_branch = || {
        let segments = rng.random_range(1..=3);
        let path: Vec<&str> = (0..segments)
            .map(|_| ["env", "a", "b"][rng.random_range(0..3)])
            .collect();
        BranchName::parse(&path.join("/")).expect("valid branch")
    };
    let (mut clashes, mut created) = (0, 0);
    for _ in 0..400 {
        let (b, at, name) = backend();
        // New branches beside existing ones are what this test makes.
        let b = b.with_branch_creation(true);
        let existing = Location {
            branch: random_branch(),
            ..at.clone()
        };
        let new = Location {
            branch: random_branch(),
            ..at.clone()
        };
        b.put_state(WriteRequest::new(
            &admin(),
            &existing,
            &name,
            state("L", 1),
            &NO_REQUEST,
        ))
        .await
        .expect("first branch");
        let answer = b
            .put_state(WriteRequest::new(
                &admin(),
                &new,
                &name,
                state("M", 1),
                &NO_REQUEST,
            ))
            .await;
        let clash = crate::refs::paths_clash(&existing.branch.full_ref(), &new.branch.full_ref());
        match answer {
            Err(ServiceError::Clash(Clash::Branch {
                branch,
                existing: other,
            })) => {
                assert!(clash, "{} {}", existing.branch, new.branch);
                assert_eq!(
                    (branch.as_str(), other.as_str()),
                    (new.branch.as_str(), existing.branch.as_str())
                );
                assert!(
                    b.store()
                        .list_states(&new, "")
                        .await
                        .expect("list")
                        .is_empty()
                );
                clashes += 1;
            }
            Ok(()) => {
                assert!(!clash, "{} {}", existing.branch, new.branch);
                created += 1;
            }
            other => panic!("{} after {}: {other:?}", new.branch, existing.branch),
        }
    }
    assert!(
        clashes > 40 && created > 40,
        "{clashes} clashes, {created} created"
    );
}

#[tokio::test]
async fn the_holders_id_from_another_user_is_locked() {
    let (b, at, name) = backend();
    b.lock(&writer("ann"), &at, &name, lock_body("A"))
        .await
        .expect("ann locks");
    b.lock(&writer("ann"), &at, &name, lock_body("A"))
        .await
        .expect("ann retries");
    for caller in [writer("bob"), admin()] {
        assert!(matches!(
            b.lock(&caller, &at, &name, lock_body("A")).await,
            Err(ServiceError::Locked(_))
        ));
        assert!(matches!(
            b.put_state(
                WriteRequest::new(&caller, &at, &name, state("L", 1), &NO_REQUEST)
                    .lock_id(Some("A"))
            )
            .await,
            Err(ServiceError::Locked(_))
        ));
    }
    b.put_state(
        WriteRequest::new(&writer("ann"), &at, &name, state("L", 1), &NO_REQUEST)
            .lock_id(Some("A")),
    )
    .await
    .expect("the holder writes");
}

/// Seals by prefixing the current key's name; opens only what the current key sealed, like a
/// deployment whose key was replaced (or whose key service is down) after some writes.
struct KeyedSealer {
    key: std::sync::Mutex<&'static str>,
    /// Keys it can still open with besides the current one.
    previous: std::sync::Mutex<Vec<&'static str>>,
    down: std::sync::atomic::AtomicBool,
}

impl KeyedSealer {
    fn key(&self) -> &'static str {
        *self.key.lock().expect("not poisoned")
    }
}

#[async_trait::async_trait]
impl Sealer for KeyedSealer {
    fn seals(&self) -> bool {
        true
    }
    fn is_sealed(&self, _: &[u8]) -> bool {
        true
    }
    async fn seal(&self, plain: &[u8], _: &Location, _: &StateName) -> Result<Bytes, SealError> {
        Ok([self.key().as_bytes(), b":", plain].concat().into())
    }
    async fn open(&self, stored: Bytes, _: &Location, _: &StateName) -> Result<Opened, SealError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(SealError::Unavailable("key service down".into()));
        }
        let mut keys = self.previous.lock().expect("not poisoned").clone();
        keys.push(self.key());
        let (key, plain) = keys
            .iter()
            .find_map(|key| Some((*key, stored.strip_prefix(format!("{key}:").as_bytes())?)))
            .ok_or_else(|| SealError::ForeignKey("sealed under another key".into()))?;
        Ok(Opened {
            plaintext: Bytes::copy_from_slice(plain),
            protection: if key == self.key() {
                Protection::Current
            } else {
                Protection::Partly
            },
            format: "test",
        })
    }
}

/// States written under a key the deployment no longer has (or while its key service is down)
/// among readable ones: the list still lists every state (the unopenable ones without a
/// serial) and each state page is still served, with the unopenable versions' changes unknown.
#[tokio::test]
async fn unopenable_states_leave_lists_and_pages_working() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    for round in 0..6 {
        let sealer = Arc::new(KeyedSealer {
            key: std::sync::Mutex::new("old"),
            previous: std::sync::Mutex::new(Vec::new()),
            down: false.into(),
        });
        let (b, at, _) = backend();
        let b = b.with_encryption(Encryption {
            sealer: sealer.clone(),
            enforced: false,
        });
        let count = rng.random_range(2..7);
        let names: Vec<StateName> = (0..count)
            .map(|i| StateName::parse(&format!("s{round}/n{i}.tfstate")).expect("valid"))
            .collect();
        // Serial-less contents make the list open the newest version.
        let body = |serial: u64| {
            Bytes::from(format!(
                r#"{{"version":4,"resources":[{{"mode":"managed","type":"t","name":"r{serial}"}}]}}"#
            ))
        };
        for name in &names {
            b.put_state(WriteRequest::new(&admin(), &at, name, body(1), &NO_REQUEST))
                .await
                .expect("old key");
        }
        // The key is replaced; some states are written twice more under the new one, then
        // the old key is gone.
        *sealer.key.lock().expect("not poisoned") = "new";
        sealer.previous.lock().expect("not poisoned").push("old");
        let rewritten: Vec<bool> = names.iter().map(|_| rng.random_bool(0.5)).collect();
        for (name, again) in names.iter().zip(&rewritten) {
            if *again {
                for serial in [2, 3] {
                    b.put_state(WriteRequest::new(
                        &admin(),
                        &at,
                        name,
                        body(serial),
                        &NO_REQUEST,
                    ))
                    .await
                    .expect("new key");
                }
            }
        }
        sealer.previous.lock().expect("not poisoned").clear();
        // Down first: what does not open is not remembered, so it opens once the service is back.
        for down in [true, false] {
            sealer.down.store(down, std::sync::atomic::Ordering::SeqCst);
            let rows = b
                .list_states(&admin(), &at, &ReadContext::no_request())
                .await
                .expect("the list is served");
            assert_eq!(rows.len(), names.len(), "every state is listed");
            assert!(rows.iter().all(|row| row.entry.is_some()));
            for (name, again) in names.iter().zip(&rewritten) {
                let page = b
                    .state_page(&admin(), &at, name, 0, 10, &NO_REQUEST)
                    .await
                    .expect("the page is served");
                let opens = |i: usize| !down && *again && i == 0;
                assert_eq!(page.versions.len(), 1 + 2 * usize::from(*again));
                for (i, version) in page.versions.iter().enumerate() {
                    // Changes need this version and the one before it to open.
                    assert_eq!(
                        version.changes.is_some(),
                        opens(i),
                        "{name} #{i} down={down}"
                    );
                }
                assert_eq!(page.resources.is_some(), opens(0), "{name}");
            }
        }
    }
}

/// The memory store, whose writes of states fail (as a git remote that went away) while
/// `fail_writes` is set, and whose next `fail_releases` lock releases fail so; locks otherwise
/// work.
#[derive(Default)]
struct FlakyStore {
    inner: MemoryStore,
    fail_writes: std::sync::atomic::AtomicBool,
    fail_releases: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl StateStore for FlakyStore {
    async fn read_state(
        &self,
        at: &Location,
        name: &StateName,
        read: &ReadContext,
    ) -> Result<Option<Bytes>, StoreError> {
        self.inner.read_state(at, name, read).await
    }
    async fn read_lock(
        &self,
        at: &Location,
        name: &StateName,
    ) -> Result<Option<HeldLock>, StoreError> {
        self.inner.read_lock(at, name).await
    }
    async fn clash(&self, at: &Location, name: &StateName) -> Result<Option<Clash>, StoreError> {
        self.inner.clash(at, name).await
    }
    async fn acquire_lock(
        &self,
        at: &Location,
        name: &StateName,
        lock: &crate::LockInfo,
        meta: &CommitMeta,
    ) -> Result<crate::ports::Acquire, StoreError> {
        self.inner.acquire_lock(at, name, lock, meta).await
    }
    async fn release_lock(
        &self,
        at: &Location,
        name: &StateName,
        held: &HeldLock,
    ) -> Result<crate::ports::Release, StoreError> {
        let failing = self
            .fail_releases
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(StoreError::Unavailable("the remote hiccuped".into()));
        }
        self.inner.release_lock(at, name, held).await
    }
    async fn write_state(
        &self,
        at: &Location,
        name: &StateName,
        change: crate::ports::Change,
        plan: crate::ports::WritePlan,
    ) -> Result<crate::ports::Written, StoreError> {
        if self.fail_writes.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the remote went away".into()));
        }
        self.inner.write_state(at, name, change, plan).await
    }
    async fn history(
        &self,
        at: &Location,
        name: &StateName,
        skip: usize,
        limit: usize,
    ) -> Result<crate::ports::HistoryPage, StoreError> {
        StateStore::history(&self.inner, at, name, skip, limit).await
    }
    async fn read_version(
        &self,
        at: &Location,
        name: &StateName,
        version: &str,
    ) -> Result<Option<Bytes>, StoreError> {
        self.inner.read_version(at, name, version).await
    }
    async fn list_locks(&self, at: &Location) -> Result<Vec<(StateName, HeldLock)>, StoreError> {
        self.inner.list_locks(at).await
    }
    async fn list_states(&self, at: &Location, prefix: &str) -> Result<Vec<StateName>, StoreError> {
        self.inner.list_states(at, prefix).await
    }
    async fn read_config(
        &self,
        at: &Location,
        path: &str,
        fresh_within: std::time::Duration,
        read: &ReadContext,
    ) -> Result<Option<Bytes>, StoreError> {
        self.inner.read_config(at, path, fresh_within, read).await
    }
    async fn create_config(
        &self,
        at: &Location,
        path: &str,
        content: Bytes,
        meta: &CommitMeta,
    ) -> Result<bool, StoreError> {
        self.inner.create_config(at, path, content, meta).await
    }
    async fn replace_config(
        &self,
        at: &Location,
        path: &str,
        expected: Option<Bytes>,
        content: Bytes,
        meta: &CommitMeta,
    ) -> Result<bool, StoreError> {
        self.inner
            .replace_config(at, path, expected, content, meta)
            .await
    }
}

/// How an operation under gitstate's own lock ends.
#[derive(Debug, Clone, Copy)]
enum Ending {
    Succeeds,
    /// The action itself returns a client error.
    Fails,
    /// The action returns a store failure.
    StoreFails,
    /// A restore whose write meets a failing store.
    RestoreWriteFails,
    /// A rekey whose key service is down.
    RekeyKeysDown,
    /// A restore whose lock's release meets a transient failure, once.
    RestoreReleaseFailsOnce,
}

/// Whatever the operation under the lock does (succeeds, fails, meets a failing store or key
/// service), the lock is released afterwards, the state is as before unless it succeeded, and
/// the next Terraform run can lock; seeded random sequences of endings over one backend.
#[tokio::test]
async fn the_own_lock_is_always_released() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x10c4);
    let store = Arc::new(FlakyStore::default());
    let sealer = Arc::new(KeyedSealer {
        key: std::sync::Mutex::new("k"),
        previous: std::sync::Mutex::new(Vec::new()),
        down: false.into(),
    });
    let (b, at, name) = backend();
    let b = Backend::new(store.clone(), b.repositories.clone(), b.committer.clone())
        .with_unlocked_writes(true)
        .with_encryption(Encryption {
            sealer: sealer.clone(),
            enforced: false,
        });
    b.put_state(WriteRequest::new(
        &admin(),
        &at,
        &name,
        state("L", 1),
        &NO_REQUEST,
    ))
    .await
    .expect("first write");
    let mut seen = [0usize; 6];
    for round in 0..72 {
        let ending = [
            Ending::Succeeds,
            Ending::Fails,
            Ending::StoreFails,
            Ending::RestoreWriteFails,
            Ending::RekeyKeysDown,
            Ending::RestoreReleaseFailsOnce,
        ][rng.random_range(0..6)];
        seen[ending as usize] += 1;
        let before = b
            .get_state(&admin(), &at, &name, &NO_REQUEST)
            .await
            .expect("readable");
        let lock = || super::lock::OwnLock {
            id: format!("own-{round}"),
            operation: "OperationTypeTest",
            info: "test".into(),
            who: "root@gitstate".into(),
        };
        let outcome: Result<(), ServiceError> = match ending {
            Ending::Succeeds => {
                let (b, at, name) = (&b, &at, &name);
                b.under_lock(&admin(), at, name, lock(), |id| async move {
                    // The lock is held while the action runs, under its own ID.
                    let held = b.get_lock(&admin(), at, name).await?;
                    assert_eq!(held.info.id(), id);
                    Ok(())
                })
                .await
            }
            Ending::Fails => {
                b.under_lock(&admin(), &at, &name, lock(), |_| async {
                    Err(ServiceError::NotFound)
                })
                .await
            }
            Ending::StoreFails => {
                b.under_lock(&admin(), &at, &name, lock(), |_| async {
                    Err(StoreError::Unavailable("gone".into()).into())
                })
                .await
            }
            Ending::RestoreWriteFails => {
                store
                    .fail_writes
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                let restored = b
                    .restore(&admin(), &at, &name, &Selector::Serial(1), &NO_REQUEST)
                    .await;
                store
                    .fail_writes
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                restored.map(drop)
            }
            Ending::RestoreReleaseFailsOnce => {
                store.fail_releases.store(1, SeqCst);
                let restored = b
                    .restore(&admin(), &at, &name, &Selector::Serial(1), &NO_REQUEST)
                    .await;
                assert_eq!(store.fail_releases.load(SeqCst), 0, "the release was tried");
                restored.map(drop)
            }
            Ending::RekeyKeysDown => {
                sealer.down.store(true, std::sync::atomic::Ordering::SeqCst);
                let rekeyed = b.rekey(&admin(), &at, &name, &NO_REQUEST).await;
                sealer
                    .down
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                rekeyed.map(drop)
            }
        };
        match (ending, outcome) {
            (Ending::Succeeds | Ending::RestoreReleaseFailsOnce, Ok(())) => {}
            (Ending::Fails, Err(ServiceError::NotFound))
            | (
                Ending::StoreFails | Ending::RestoreWriteFails,
                Err(ServiceError::Store(StoreError::Unavailable(_))),
            )
            | (Ending::RekeyKeysDown, Err(ServiceError::Seal(SealError::Unavailable(_)))) => {}
            (ending, other) => panic!("{ending:?}: {other:?}"),
        }
        assert!(
            matches!(
                b.get_lock(&admin(), &at, &name).await,
                Err(ServiceError::NoLock)
            ),
            "{ending:?} left the lock"
        );
        let after = b
            .get_state(&admin(), &at, &name, &NO_REQUEST)
            .await
            .expect("readable");
        if !matches!(ending, Ending::RestoreReleaseFailsOnce) {
            assert_eq!(after, before, "{ending:?}");
        }
        let terraform = format!("tf-{round}");
        b.lock(&admin(), &at, &name, lock_body(&terraform))
            .await
            .expect("the next run locks");
        b.unlock(&admin(), &at, &name, &lock_body(&terraform))
            .await
            .expect("and unlocks");
    }
    assert!(seen.iter().all(|n| *n >= 5), "{seen:?}");
}

/// Every commit of the service carries its trailers as `Trailers::parse` reads them: writes
/// their serial, lineage, lock and user; a restore also the revision it wrote again; deletes
/// and locks their lock and user; a hostile lock ID and `Who` stay in their own trailers.
#[tokio::test]
async fn commits_carry_their_trailers() {
    use crate::trailers::{Trailers, WITHOUT_LOCK};
    let store = Arc::new(MemoryStore::default());
    let (b, at, name) = backend();
    let b = Backend::new(store.clone(), b.repositories.clone(), b.committer.clone())
        .with_unlocked_writes(true);
    let last = || Trailers::parse(&store.history().last().expect("a commit").message);
    b.put_state(WriteRequest::new(
        &writer("ann"),
        &at,
        &name,
        state("L", 1),
        &NO_REQUEST,
    ))
    .await
    .expect("write");
    let written = last();
    assert_eq!(
        (written.serial, written.lineage.as_deref()),
        (Some(1), Some("L"))
    );
    assert_eq!(
        (written.lock_id.as_deref(), written.user.as_deref()),
        (Some(WITHOUT_LOCK), Some("ann"))
    );
    let hostile = Bytes::from(
        r#"{"ID":"X\nUser: root","Operation":"OperationTypeApply","Who":"me\n\nSerial: 99"}"#,
    );
    b.lock(&writer("ann"), &at, &name, hostile)
        .await
        .expect("lock");
    let locked = last();
    assert_eq!(locked.lock_id.as_deref(), Some("X User: root"));
    assert_eq!(locked.who.as_deref(), Some("me  Serial: 99"));
    assert_eq!((locked.user.as_deref(), locked.serial), (Some("ann"), None));
    b.unlock(&admin(), &at, &name, b"").await.expect("force");
    b.put_state(WriteRequest::new(
        &admin(),
        &at,
        &name,
        state("L", 2),
        &NO_REQUEST,
    ))
    .await
    .expect("write");
    let (from, _) = b
        .get_version(&admin(), &at, &name, &Selector::Serial(1))
        .await
        .expect("serial 1");
    let restored = b
        .restore(&admin(), &at, &name, &Selector::Serial(1), &NO_REQUEST)
        .await
        .expect("restore");
    let log = store.history();
    let restore = log
        .iter()
        .rev()
        .find(|c| c.message.starts_with("restore "))
        .expect("the restore commit");
    let trailers = Trailers::parse(&restore.message);
    assert_eq!(trailers.restored_from.as_deref(), Some(from.as_str()));
    assert_eq!(trailers.serial, Some(restored.serial));
    assert_eq!(trailers.operation.as_deref(), Some("OperationTypeRestore"));
    b.delete_state(&admin(), &at, &name, None, &NO_REQUEST)
        .await
        .expect("delete");
    assert_eq!(last().user.as_deref(), Some("root"));
    assert_eq!(last().serial, None);
}

/// Rekey rewrites a state sealed under a previous key under its own lock, leaves one under the
/// current key alone, reports a missing one, and releases its lock every time.
#[tokio::test]
async fn rekey_rewrites_under_its_own_lock() {
    use crate::trailers::Trailers;
    let store = Arc::new(MemoryStore::default());
    let sealer = Arc::new(KeyedSealer {
        key: std::sync::Mutex::new("old"),
        previous: std::sync::Mutex::new(Vec::new()),
        down: false.into(),
    });
    let (b, at, name) = backend();
    let b = Backend::new(store.clone(), b.repositories.clone(), b.committer.clone())
        .with_unlocked_writes(true)
        .with_encryption(Encryption {
            sealer: sealer.clone(),
            enforced: false,
        });
    b.put_state(WriteRequest::new(
        &admin(),
        &at,
        &name,
        state("L", 4),
        &NO_REQUEST,
    ))
    .await
    .expect("write");
    *sealer.key.lock().expect("not poisoned") = "new";
    sealer.previous.lock().expect("not poisoned").push("old");
    assert_eq!(
        b.rekey(&admin(), &at, &name, &NO_REQUEST)
            .await
            .expect("rekey"),
        Rekeyed::Rewritten { from: "test" }
    );
    let stored = b
        .store()
        .read_state(&at, &name, &NO_REQUEST)
        .await
        .expect("read");
    assert!(stored.expect("stored").starts_with(b"new:"));
    let log = store.history();
    let rekey = log
        .iter()
        .find(|c| c.message.starts_with("rekey "))
        .expect("the rekey commit");
    let trailers = Trailers::parse(&rekey.message);
    assert!(trailers.lock_id.expect("a lock").starts_with("rekey-"));
    assert_eq!(
        (trailers.who.as_deref(), trailers.serial),
        (Some("root@gitstate"), Some(4))
    );
    assert_eq!(
        b.rekey(&admin(), &at, &name, &NO_REQUEST)
            .await
            .expect("rekey"),
        Rekeyed::Current
    );
    let missing = StateName::parse("net/none.tfstate").expect("valid");
    assert_eq!(
        b.rekey(&admin(), &at, &missing, &NO_REQUEST)
            .await
            .expect("rekey"),
        Rekeyed::Missing
    );
    for name in [&name, &missing] {
        assert!(matches!(
            b.get_lock(&admin(), &at, name).await,
            Err(ServiceError::NoLock)
        ));
    }
    assert!(matches!(
        b.rekey(&writer("ann"), &at, &name, &NO_REQUEST).await,
        Err(ServiceError::Forbidden(_))
    ));
}
