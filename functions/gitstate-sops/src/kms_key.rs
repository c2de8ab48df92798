//! KMS key names as a deployment configures them: a key or alias ARN, parsed strictly, or a bare
//! alias (`alias/<name>`) or key ID that the key service resolves in its default region.
//!
//! The region a key is called in comes only from here (a configured key), never from a file.

use std::fmt;

/// AWS partitions and the region shape each one documents (the SDKs' `partitions.json`
/// `regionRegex`, with `\w+` read as lowercase letters): the partition, the region prefix, and how
/// many lowercase words follow it before the number.
const PARTITIONS: [(&str, &str); 8] = [
    ("aws", ""),
    ("aws-cn", "cn-"),
    ("aws-us-gov", "us-gov-"),
    ("aws-iso", "us-iso-"),
    ("aws-iso-b", "us-isob-"),
    ("aws-iso-e", "eu-isoe-"),
    ("aws-iso-f", "us-isof-"),
    ("aws-eusc", "eusc-de-"),
];

/// Longest alias name after `alias/` (KMS allows 256 characters including the prefix).
const MAX_ALIAS_NAME: usize = 250;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyNameError {
    #[error(
        "{0:?} is not a KMS key ARN (arn:<partition>:kms:<region>:<account>:key/<id> or …:alias/<name>)"
    )]
    NotArn(String),
    #[error("{0:?} is not an AWS partition")]
    Partition(String),
    #[error("{region:?} is not a region of partition {partition}")]
    Region { partition: String, region: String },
    #[error("{0:?} is not a 12-digit account")]
    Account(String),
    #[error("{0:?} is not a KMS key ID (a UUID or mrk- and 32 hex digits, lowercase)")]
    KeyId(String),
    #[error("{0:?} is not an alias name (letters, digits, '/', '_', '-'; at most 250; not aws/…)")]
    Alias(String),
}

/// What an ARN or bare name points at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyResource {
    /// A key ID: a UUID, or `mrk-` and 32 hex digits for a multi-Region key.
    Key(String),
    /// An alias name, without `alias/`.
    Alias(String),
}

impl fmt::Display for KeyResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Key(id) => write!(f, "key/{id}"),
            Self::Alias(name) => write!(f, "alias/{name}"),
        }
    }
}

/// A strictly parsed KMS key or alias ARN.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyArn {
    pub partition: String,
    pub region: String,
    pub account: String,
    pub resource: KeyResource,
}

impl KeyArn {
    pub fn parse(text: &str) -> Result<Self, KeyNameError> {
        let not_arn = || KeyNameError::NotArn(text.to_owned());
        let mut parts = text.splitn(6, ':');
        let (Some("arn"), Some(partition), Some("kms"), Some(region), Some(account), Some(rest)) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(not_arn());
        };
        let Some((_, prefix)) = PARTITIONS.iter().find(|(p, _)| *p == partition) else {
            return Err(KeyNameError::Partition(partition.to_owned()));
        };
        if !region_fits(prefix, region) {
            return Err(KeyNameError::Region {
                partition: partition.to_owned(),
                region: region.to_owned(),
            });
        }
        if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
            return Err(KeyNameError::Account(account.to_owned()));
        }
        let resource = if let Some(id) = rest.strip_prefix("key/") {
            KeyResource::Key(key_id(id)?)
        } else if let Some(name) = rest.strip_prefix("alias/") {
            KeyResource::Alias(alias_name(name)?)
        } else {
            return Err(not_arn());
        };
        Ok(Self {
            partition: partition.to_owned(),
            region: region.to_owned(),
            account: account.to_owned(),
            resource,
        })
    }

    /// The ARN of another resource (e.g. an alias) in this key's partition, region and account.
    pub fn sibling(&self, resource: KeyResource) -> Self {
        Self {
            resource,
            ..self.clone()
        }
    }
}

impl fmt::Display for KeyArn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "arn:{}:kms:{}:{}:{}",
            self.partition, self.region, self.account, self.resource
        )
    }
}

/// A configured key: an ARN, or a bare alias or key ID (resolved in the default region).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyName {
    Arn(KeyArn),
    Bare(KeyResource),
}

impl KeyName {
    pub fn parse(text: &str) -> Result<Self, KeyNameError> {
        if text.starts_with("arn:") {
            return KeyArn::parse(text).map(Self::Arn);
        }
        if let Some(name) = text.strip_prefix("alias/") {
            return alias_name(name).map(|n| Self::Bare(KeyResource::Alias(n)));
        }
        key_id(text).map(|id| Self::Bare(KeyResource::Key(id)))
    }
}

impl fmt::Display for KeyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Arn(arn) => arn.fmt(f),
            Self::Bare(KeyResource::Key(id)) => f.write_str(id),
            Self::Bare(alias) => alias.fmt(f),
        }
    }
}

/// `<prefix><word>-<number>` where `aws` (empty prefix) is `<geo>-<word>-<number>` with a
/// two-letter geography other than China's.
fn region_fits(prefix: &str, region: &str) -> bool {
    let rest = if prefix.is_empty() {
        let Some((geo, rest)) = region.split_once('-') else {
            return false;
        };
        if geo.len() != 2 || !geo.bytes().all(|b| b.is_ascii_lowercase()) || geo == "cn" {
            return false;
        }
        rest
    } else {
        let Some(rest) = region.strip_prefix(prefix) else {
            return false;
        };
        rest
    };
    let Some((word, number)) = rest.split_once('-') else {
        return false;
    };
    !word.is_empty()
        && word.bytes().all(|b| b.is_ascii_lowercase())
        && (1..=2).contains(&number.len())
        && number.bytes().all(|b| b.is_ascii_digit())
        && !number.starts_with('0')
}

fn key_id(id: &str) -> Result<String, KeyNameError> {
    let hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let uuid = {
        let groups: Vec<&str> = id.split('-').collect();
        groups.len() == 5
            && groups
                .iter()
                .zip([8, 4, 4, 4, 12])
                .all(|(g, n)| g.len() == n && hex(g))
    };
    let multi_region = id
        .strip_prefix("mrk-")
        .is_some_and(|h| h.len() == 32 && hex(h));
    if uuid || multi_region {
        Ok(id.to_owned())
    } else {
        Err(KeyNameError::KeyId(id.to_owned()))
    }
}

fn alias_name(name: &str) -> Result<String, KeyNameError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_ALIAS_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'-'))
        && !name
            .get(..4)
            .is_some_and(|p| p.eq_ignore_ascii_case("aws/"));
    if valid {
        Ok(name.to_owned())
    } else {
        Err(KeyNameError::Alias(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    const UUID: &str = "1234abcd-12ab-34cd-56ef-1234567890ab";
    const MRK: &str = "mrk-1234abcd12ab34cd56ef1234567890ab";

    fn valid() -> Vec<String> {
        let regions = [
            ("aws", "us-east-1"),
            ("aws", "ap-southeast-7"),
            ("aws", "il-central-1"),
            ("aws", "mx-central-1"),
            ("aws-cn", "cn-north-1"),
            ("aws-cn", "cn-northwest-1"),
            ("aws-us-gov", "us-gov-west-1"),
            ("aws-iso", "us-iso-east-1"),
            ("aws-iso-b", "us-isob-east-1"),
            ("aws-iso-e", "eu-isoe-west-1"),
            ("aws-iso-f", "us-isof-south-1"),
            ("aws-eusc", "eusc-de-east-1"),
        ];
        let mut out = Vec::new();
        for (partition, region) in regions {
            for resource in [
                format!("key/{UUID}"),
                format!("key/{MRK}"),
                "alias/gitstate-team".into(),
                "alias/a/b_c-D9".into(),
            ] {
                out.push(format!(
                    "arn:{partition}:kms:{region}:123456789012:{resource}"
                ));
            }
        }
        out
    }

    #[test]
    fn documented_shapes_parse_and_print_back() {
        for text in valid() {
            let arn = KeyArn::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(arn.to_string(), text);
            assert_eq!(KeyName::parse(&text), Ok(KeyName::Arn(arn)));
        }
        for bare in [UUID, MRK, "alias/tfstate", "alias/team/x_y-z"] {
            let name = KeyName::parse(bare).unwrap_or_else(|e| panic!("{bare}: {e}"));
            assert!(matches!(name, KeyName::Bare(_)));
            assert_eq!(name.to_string(), bare);
        }
    }

    #[test]
    fn known_bad_shapes_are_refused() {
        for bad in [
            "",
            "arn",
            "arn:aws:kms:us-east-1:123456789012:key/",
            "arn:aws:kms:us-east-1:123456789012:alias/",
            "arn:aws:kms:us-east-1:123456789012:alias/aws/ebs",
            "arn:aws:kms:us-east-1:123456789012:alias/AWS/ebs",
            "arn:aws:kms:us-east-1:123456789012:key/1234ABCD-12ab-34cd-56ef-1234567890ab",
            "arn:aws:kms:us-east-1:123456789012:keys/1234abcd-12ab-34cd-56ef-1234567890ab",
            "arn:aws:kms:us-east-1:12345678901:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "arn:aws:kms:us-east-1:1234567890123:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "arn:aws:kms::123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "arn:aws:kms:cn-north-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "arn:aws-cn:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "arn:aws:kms:us-gov-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "arn:aws:kms:us-east-01:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "arn:aws:kms:us-east-1.evil.example:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "arn:aws:kms:localhost:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "arn:aws:s3:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "arn:evil:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "alias/",
            "alias/aws/s3",
            "alias/a b",
            "tfstate",
            "mrk-1234",
        ] {
            assert!(KeyName::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    /// A mutation of a valid ARN is either refused, or parses to something that prints back to
    /// exactly the mutated text and still holds every rule (so nothing is silently normalised).
    #[test]
    fn seeded_mutations_never_slip_through() {
        let seed: u64 = std::env::var("GITSTATE_ARN_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x006b_6d73_5f61_726e);
        let mut rng = StdRng::seed_from_u64(seed);
        let alphabet: Vec<char> = "arnwskm:/-_.0123456789abcdefABCDEFxyz \u{e9}\n"
            .chars()
            .collect();
        let valid = valid();
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let mut chars: Vec<char> = valid[rng.random_range(0..valid.len())].chars().collect();
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(0..=chars.len());
                match rng.random_range(0..3) {
                    0 if at < chars.len() => {
                        chars.remove(at);
                    }
                    1 if at < chars.len() => {
                        chars[at] = alphabet[rng.random_range(0..alphabet.len())];
                    }
                    _ => chars.insert(at, alphabet[rng.random_range(0..alphabet.len())]),
                }
            }
            let text: String = chars.into_iter().collect();
            match KeyArn::parse(&text) {
                Ok(arn) => {
                    accepted += 1;
                    assert_eq!(arn.to_string(), text, "seed {seed}");
                    check_rules(&arn, &text, seed);
                }
                Err(_) => refused += 1,
            }
        }
        // both outcomes happen, or the mutations test nothing
        assert!(accepted > 100 && refused > 100, "{accepted} {refused}");
    }

    pub(super) fn check_rules(arn: &KeyArn, text: &str, seed: u64) {
        assert!(
            PARTITIONS
                .iter()
                .any(|(p, prefix)| *p == arn.partition && region_fits(prefix, &arn.region)),
            "{text} (seed {seed})"
        );
        assert!(
            arn.region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
            "{text} (seed {seed})"
        );
        assert!(
            arn.account.len() == 12 && arn.account.bytes().all(|b| b.is_ascii_digit()),
            "{text} (seed {seed})"
        );
        match &arn.resource {
            KeyResource::Key(id) => assert!(key_id(id).is_ok(), "{text} (seed {seed})"),
            KeyResource::Alias(name) => assert!(
                !name.to_ascii_lowercase().starts_with("aws/")
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"/_-".contains(&b)),
                "{text} (seed {seed})"
            ),
        }
    }
}
