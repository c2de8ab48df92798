//! Who may do what: users with argon2id hashes and grants on state path prefixes, as written in
//! an access file (TOML):
//!
//! ```toml
//! [users.alice]
//! hash = "$argon2id$v=19$m=19456,t=2,p=1$…"
//! grants = ["write:network/", "read:*"]
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::StateName;
use crate::password::{HashError, check_phc, memory_kib};

/// Where the access file lives in the state repository, on the configured branch.
pub const ACCESS_PATH: &str = ".gitstate/access.toml";

/// Longest user name accepted.
pub const MAX_USER_BYTES: usize = 64;

/// What a grant allows; each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Read states and locks.
    Read,
    /// Read, lock, unlock one's own lock, write.
    Write,
    /// Write, force-unlock anyone's lock, delete states.
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Read, Role::Write, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role on every state whose path starts with `prefix` (`*` in the file: every state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub role: Role,
    pub prefix: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("the access file is not valid TOML for gitstate: {0}")]
    Syntax(String),
    #[error("user {user:?}: {reason}")]
    User { user: String, reason: String },
    #[error("grant {grant:?}: {reason}")]
    Grant { grant: String, reason: String },
}

impl Grant {
    /// `role:prefix`, e.g. `write:network/`, `read:*`, `admin:*`.
    pub fn parse(text: &str) -> Result<Self, AccessError> {
        let bad = |reason: &str| AccessError::Grant {
            grant: text.chars().take(100).collect(),
            reason: reason.to_owned(),
        };
        let (role, prefix) = text
            .split_once(':')
            .ok_or_else(|| bad("write it as role:prefix, e.g. write:network/ or read:*"))?;
        let role = match role {
            "read" => Role::Read,
            "write" => Role::Write,
            "admin" => Role::Admin,
            _ => return Err(bad("the role must be read, write or admin")),
        };
        let prefix = match prefix {
            "*" => String::new(),
            "" => return Err(bad("empty prefix: use * for every state")),
            p if p.starts_with('/') || p.starts_with('.') || p.contains("..") => {
                return Err(bad(
                    "the prefix is a relative path: no leading '/' or '.', no '..'",
                ));
            }
            p if !p
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/')) =>
            {
                return Err(bad("the prefix has a character outside [A-Za-z0-9._/-]"));
            }
            p => p.to_owned(),
        };
        Ok(Self { role, prefix })
    }

    /// What the grant allows, in words.
    pub fn describe(&self) -> String {
        let scope = if self.prefix.is_empty() {
            "every state".to_owned()
        } else {
            format!("states under {}", self.prefix)
        };
        let can = match self.role {
            Role::Read => "read states and locks",
            Role::Write => "read, lock, write, release own locks",
            Role::Admin => "read, lock, write, force-unlock any lock, delete",
        };
        format!("{can} on {scope}")
    }

    /// Does this grant give at least `role` on `name`?
    pub fn allows(&self, role: Role, name: &StateName) -> bool {
        self.role >= role && name.as_str().starts_with(&self.prefix)
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = if self.prefix.is_empty() {
            "*"
        } else {
            &self.prefix
        };
        write!(f, "{}:{prefix}", self.role)
    }
}

/// One user of the access file.
#[derive(Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    /// The argon2id PHC string.
    pub hash: String,
    pub grants: Vec<Grant>,
}

impl fmt::Debug for User {
    // The hash stays out of logs: it is what an offline guesser would need.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("grants", &self.grants)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct FileFormat {
    #[serde(default)]
    users: BTreeMap<String, FileUser>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct FileUser {
    hash: String,
    #[serde(default)]
    grants: Vec<String>,
}

/// Check a user name: short, printable, and safe in a commit trailer.
pub fn check_user_name(name: &str) -> Result<(), AccessError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_USER_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@'));
    if ok {
        Ok(())
    } else {
        Err(AccessError::User {
            user: name.chars().take(MAX_USER_BYTES).collect(),
            reason: format!("a user name is 1 to {MAX_USER_BYTES} characters of [A-Za-z0-9._@-]"),
        })
    }
}

/// `user` as an access file entry (`[users."first.last"]` with its hash and grants), written by
/// the TOML serialiser so that any valid name is quoted as it must be. Appended to an access
/// file, it adds that user and leaves the others alone. The name and hash are checked first, so
/// the entry always parses back to `user`.
pub fn entry_toml(user: &User) -> Result<String, AccessError> {
    check_user_name(&user.name)?;
    let refused = |reason: String| AccessError::User {
        user: user.name.clone(),
        reason,
    };
    check_phc(&user.hash).map_err(|e| refused(e.to_string()))?;
    let entry = FileUser {
        hash: user.hash.clone(),
        grants: user.grants.iter().map(Grant::to_string).collect(),
    };
    let file = FileFormat {
        users: BTreeMap::from([(user.name.clone(), entry)]),
    };
    toml::to_string(&file).map_err(|e| refused(e.to_string()))
}

/// Every user and their grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    users: BTreeMap<String, User>,
}

impl Policy {
    /// Parse and check an access file: every hash argon2id at OWASP strength, every grant valid.
    pub fn parse(text: &str) -> Result<Self, AccessError> {
        let file: FileFormat = toml::from_str(text).map_err(|e| {
            AccessError::Syntax(e.to_string().lines().next().unwrap_or_default().to_owned())
        })?;
        let mut users = BTreeMap::new();
        for (name, entry) in file.users {
            check_user_name(&name)?;
            check_phc(&entry.hash).map_err(|e: HashError| AccessError::User {
                user: name.clone(),
                reason: e.to_string(),
            })?;
            let grants = entry
                .grants
                .iter()
                .map(|g| Grant::parse(g))
                .collect::<Result<Vec<_>, _>>()?;
            users.insert(
                name.clone(),
                User {
                    name,
                    hash: entry.hash,
                    grants,
                },
            );
        }
        Ok(Self { users })
    }

    /// Add the deployment's bootstrap administrator, unless the file defines that user itself
    /// (the file then wins: access changes are reviewed commits).
    pub fn with_bootstrap(mut self, name: &str, hash: &str) -> Result<Self, AccessError> {
        check_user_name(name)?;
        check_phc(hash).map_err(|e| AccessError::User {
            user: name.to_owned(),
            reason: format!("GITSTATE_ADMIN_HASH: {e}"),
        })?;
        self.users.entry(name.to_owned()).or_insert_with(|| User {
            name: name.to_owned(),
            hash: hash.to_owned(),
            grants: vec![Grant {
                role: Role::Admin,
                prefix: String::new(),
            }],
        });
        Ok(self)
    }

    /// Refuse a policy with a hash that asks more than `budget_kib` of memory (what one argon2
    /// check may take in this process, see [`crate::password::hash_memory_budget`]).
    pub fn within_memory(self, budget_kib: u32) -> Result<Self, AccessError> {
        for user in self.users.values() {
            if let Some(m) = memory_kib(&user.hash).filter(|m| *m > budget_kib) {
                return Err(AccessError::User {
                    user: user.name.clone(),
                    reason: HashError::Memory {
                        m,
                        budget: budget_kib,
                    }
                    .to_string(),
                });
            }
        }
        Ok(self)
    }

    pub fn user(&self, name: &str) -> Option<&User> {
        self.users.get(name)
    }

    pub fn users(&self) -> impl Iterator<Item = &User> {
        self.users.values()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

/// The authenticated user of a request and what they were granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    grants: Arc<[Grant]>,
}

/// A request the caller's grants do not cover.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("user {user} needs the {role} grant on {state}")]
pub struct Denied {
    pub user: String,
    pub role: Role,
    pub state: String,
}

impl Caller {
    pub fn new(user: impl Into<String>, grants: Vec<Grant>) -> Self {
        Self {
            user: user.into(),
            grants: grants.into(),
        }
    }

    /// An operator acting through the command line with the store's own credentials: admin on
    /// everything.
    pub fn operator(name: impl Into<String>) -> Self {
        Self::new(
            name,
            vec![Grant {
                role: Role::Admin,
                prefix: String::new(),
            }],
        )
    }

    pub fn grants(&self) -> &[Grant] {
        &self.grants
    }

    pub fn may(&self, role: Role, name: &StateName) -> bool {
        self.grants.iter().any(|g| g.allows(role, name))
    }

    pub fn require(&self, role: Role, name: &StateName) -> Result<(), Denied> {
        if self.may(role, name) {
            Ok(())
        } else {
            Err(Denied {
                user: self.user.clone(),
                role,
                state: name.to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$0Yp3mXH6Ee0zI9BcqdqplmhCgEVMvS/FcwkKo7Y1kpE";

    fn name(s: &str) -> StateName {
        StateName::parse(s).expect("valid name")
    }

    #[test]
    fn grants_parse_and_match_prefixes() {
        let g = Grant::parse("write:network/").expect("valid");
        assert!(g.allows(Role::Read, &name("network/prod.tfstate")));
        assert!(g.allows(Role::Write, &name("network/prod.tfstate")));
        assert!(!g.allows(Role::Admin, &name("network/prod.tfstate")));
        assert!(!g.allows(Role::Read, &name("networking/prod.tfstate")));
        let all = Grant::parse("read:*").expect("valid");
        assert!(all.allows(Role::Read, &name("x.tfstate")));
        assert_eq!(all.to_string(), "read:*");
        for bad in [
            "write",
            "owner:*",
            "read:",
            "read:/etc",
            "read:../x",
            "read:a b",
            "read:.gitstate/",
        ] {
            assert!(Grant::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn policy_parses_checks_and_bootstraps() {
        let text = format!(
            "[users.alice]\nhash = \"{HASH}\"\ngrants = [\"write:network/\", \"read:*\"]\n"
        );
        let policy = Policy::parse(&text).expect("valid file");
        let alice = policy.user("alice").expect("alice");
        assert_eq!(alice.grants.len(), 2);
        assert!(
            !format!("{alice:?}").contains("argon2"),
            "Debug hides the hash"
        );
        let policy = policy.with_bootstrap("root", HASH).expect("bootstrap");
        assert_eq!(policy.users().count(), 2);
        assert_eq!(
            policy.user("root").expect("root").grants[0].role,
            Role::Admin
        );

        for (bad, needle) in [
            ("[users.bob]\nhash = \"secret\"\n", "PHC"),
            ("[users.bob]\npassword = \"x\"\n", "TOML"),
            ("[users.\"b b\"]\nhash = \"x\"\n", "user name"),
            ("users = 3", "TOML"),
        ] {
            let error = Policy::parse(bad).expect_err(bad).to_string();
            assert!(error.contains(needle), "{bad}: {error}");
        }
        let weak = "[users.bob]\nhash = \"$argon2id$v=19$m=4096,t=3,p=1$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG\"\n";
        assert!(
            Policy::parse(weak)
                .expect_err("weak")
                .to_string()
                .contains("weaker")
        );
        let costly = "[users.bob]\nhash = \"$argon2id$v=19$m=4194304,t=2,p=1$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG\"\n";
        assert!(
            Policy::parse(costly)
                .expect_err("costly")
                .to_string()
                .contains("exceed the maximum")
        );
    }

    #[test]
    fn caller_requires_the_role() {
        let caller = Caller::new("ci", vec![Grant::parse("write:app/").expect("valid")]);
        assert!(caller.require(Role::Write, &name("app/x.tfstate")).is_ok());
        let denied = caller
            .require(Role::Admin, &name("app/x.tfstate"))
            .expect_err("no admin");
        assert_eq!(
            denied.to_string(),
            "user ci needs the admin grant on app/x.tfstate"
        );
        assert!(Caller::operator("ops").may(Role::Admin, &name("any/thing.tfstate")));
    }

    /// A user name over the whole alphabet `check_user_name` allows, 1 to 64 bytes.
    fn user_name(rng: &mut impl rand::Rng) -> String {
        const ALPHABET: &[u8] =
            b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._@-";
        let len = match rng.random_range(0..4) {
            0 => 1,
            1 => MAX_USER_BYTES,
            _ => rng.random_range(1..=MAX_USER_BYTES),
        };
        (0..len)
            .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
            .collect()
    }

    fn grant(rng: &mut impl rand::Rng) -> Grant {
        const PREFIX: &[u8] = b"abcXYZ019._-/";
        let role = Role::ALL[rng.random_range(0..Role::ALL.len())];
        let prefix = loop {
            if rng.random_bool(0.2) {
                break String::new();
            }
            let len = rng.random_range(1..12);
            let p: String = (0..len)
                .map(|_| char::from(PREFIX[rng.random_range(0..PREFIX.len())]))
                .collect();
            if !p.starts_with(['/', '.']) && !p.contains("..") {
                break p;
            }
        };
        Grant { role, prefix }
    }

    fn user(rng: &mut impl rand::Rng, name: String) -> User {
        User {
            name,
            hash: HASH.to_owned(),
            grants: (0..rng.random_range(0..4)).map(|_| grant(rng)).collect(),
        }
    }

    /// Generated users (every allowed name shape: dots, `@`, dashes, digits only, 64 bytes) and
    /// grants: the entry parses back to the same user, and appended to an access file it adds
    /// that user and leaves every other user as it was.
    #[test]
    fn entries_parse_back_and_merge_into_a_file_for_generated_users() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let fixed = [
            "first.last",
            "a@b.example",
            "1.2.3",
            "...",
            "@",
            "-",
            "users.x",
        ];
        for i in 0..500 {
            let name = fixed
                .get(i)
                .map_or_else(|| user_name(&mut rng), |n| (*n).to_owned());
            let new = user(&mut rng, name.clone());
            let entry = entry_toml(&new).expect("a valid user");
            let alone = Policy::parse(&entry).expect("the entry parses");
            assert_eq!(alone.users().collect::<Vec<_>>(), [&new], "{entry}");

            let mut others: Vec<User> = Vec::new();
            let mut file = "# the team's access file\n[users.root]\n".to_owned();
            file.push_str(&format!("hash = \"{HASH}\"\ngrants = [\"admin:*\"]\n"));
            for _ in 0..rng.random_range(0..4) {
                let other_name = user_name(&mut rng);
                let other = user(&mut rng, other_name);
                if other.name != name
                    && other.name != "root"
                    && !others.iter().any(|o| o.name == other.name)
                {
                    file.push_str(&entry_toml(&other).expect("valid"));
                    others.push(other);
                }
            }
            let before = Policy::parse(&file).expect("the file parses");
            if name == "root" || others.iter().any(|o| o.name == name) {
                continue;
            }
            let merged = Policy::parse(&format!("{file}\n{entry}")).expect("merged file parses");
            assert_eq!(merged.users().count(), before.users().count() + 1);
            assert_eq!(merged.user(&name), Some(&new), "{entry}");
            for old in before.users() {
                assert_eq!(merged.user(&old.name), Some(old));
            }
            // The same user twice is a clear error, never a silent replacement.
            let twice = Policy::parse(&format!("{file}{entry}{entry}"));
            assert!(matches!(twice, Err(AccessError::Syntax(_))), "{twice:?}");
        }
    }

    /// Names outside the alphabet and hashes that are no argon2id PHC string make no entry.
    #[test]
    fn entries_refuse_what_the_access_file_would_refuse() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let bad_chars = [
            ' ', '"', '\'', '[', ']', '=', '\n', '#', '/', 'é', '雪', '\0', '+',
        ];
        for _ in 0..300 {
            let mut name = user_name(&mut rng);
            let at = rng.random_range(0..=name.len());
            name.insert(at, bad_chars[rng.random_range(0..bad_chars.len())]);
            let entry = entry_toml(&user(&mut rng, name.clone()));
            assert!(matches!(entry, Err(AccessError::User { .. })), "{name:?}");
        }
        let long = user(&mut rng, "x".repeat(MAX_USER_BYTES + 1));
        assert!(entry_toml(&long).is_err());
        let mut weak = user(&mut rng, "bob".into());
        weak.hash = "secret".into();
        assert!(
            entry_toml(&weak)
                .expect_err("not PHC")
                .to_string()
                .contains("bob")
        );
    }
}
