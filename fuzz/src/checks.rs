//! The properties each fuzz target checks, as plain functions: `cargo fuzz` drives them with
//! libFuzzer, and `tests/it/fuzz_corpus.rs` replays the committed corpora through them in every
//! `cargo test`.
//!
//! Beyond "never panics", each checks what the parser promises.

use base64::Engine as _;
use gitstate_core::auth::parse_basic;
use gitstate_core::refs::{
    AllowedRefs, RefPolicy, branch_clash, clashes_with_lock_prefix, paths_clash,
};
use gitstate_core::{BranchName, StateName};
use gitstate_git::protocol::pkt;
use gitstate_git::protocol::{Advert, PushReport, Service};

/// State and branch names: an accepted name is a safe relative path and a valid ref component.
pub fn state_name(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(name) = StateName::parse(text) {
        let s = name.as_str();
        assert!(!s.is_empty() && s.len() <= 200, "length of {s:?}");
        assert!(!s.contains(".."), "{s:?} has ..");
        for segment in s.split('/') {
            assert!(!segment.is_empty(), "{s:?} has an empty segment");
            assert!(!segment.starts_with('.'), "{s:?} has a dot segment");
            assert!(!segment.ends_with(".lock"), "{s:?} ends .lock");
            assert!(!segment.ends_with('.'), "{s:?} has a segment ending in '.'");
            assert!(
                segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')),
                "{s:?} has a character outside the set"
            );
        }
        let lock_ref = format!("refs/heads/locks/{s}");
        assert!(
            is_git_ref_name(&lock_ref),
            "{lock_ref:?} is not a git ref name"
        );
        assert_eq!(StateName::parse(s).as_ref(), Ok(&name), "parsing is stable");
    }
    if let Ok(branch) = BranchName::parse(text) {
        let full = branch.full_ref();
        assert!(full.starts_with("refs/heads/") && !full.contains(".."));
        assert!(is_git_ref_name(&full), "{full:?} is not a git ref name");
        assert!(!branch.as_str().split('/').any(|s| s.starts_with('-')));
    }
}

/// Whether `name` is a valid git ref name, by git's own rules (`git check-ref-format`), written
/// out independently of gitstate's parser.
fn is_git_ref_name(name: &str) -> bool {
    !name.is_empty()
        && name != "@"
        && !name.ends_with('/')
        && !name.ends_with('.')
        && !name.contains("..")
        && !name.contains("@{")
        && !name
            .bytes()
            .any(|b| b < 0x20 || b == 0x7f || b" ~^:?*[\\".contains(&b))
        && name
            .split('/')
            .all(|c| !c.is_empty() && !c.starts_with('.') && !c.ends_with(".lock"))
}

/// The ref allowlist: the input is four lines (configured branch, lock ref prefix, allowlist,
/// requested ref). Never panics; a configuration that is accepted has a branch clear of the lock
/// refs; a ref that is accepted is the configured branch or allowlisted, clashes neither with the
/// lock refs nor with the configured branch, and is a valid git ref name.
pub fn ref_name(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.splitn(4, '\n');
    let (Some(branch), Some(prefix), Some(allowed), Some(asked)) =
        (lines.next(), lines.next(), lines.next(), lines.next())
    else {
        return;
    };
    // The settings' own check of the prefix.
    if !prefix.starts_with("refs/") || !prefix.ends_with('/') || prefix.contains("..") {
        return;
    }
    let (Ok(branch), Ok(allowed)) = (BranchName::parse(branch), AllowedRefs::parse(allowed)) else {
        return;
    };
    let Ok(policy) = RefPolicy::new(branch.clone(), prefix, allowed.clone()) else {
        return;
    };
    assert!(
        !clashes_with_lock_prefix(&branch.full_ref(), prefix),
        "configured {branch} clashes with {prefix}"
    );
    let Ok(asked) = BranchName::parse(asked) else {
        return;
    };
    match policy.check(&asked) {
        Ok(()) => {
            let full = asked.full_ref();
            assert!(is_git_ref_name(&full), "{full:?} is not a git ref name");
            assert!(
                !clashes_with_lock_prefix(&full, prefix),
                "{full} clashes with {prefix}"
            );
            assert!(
                asked == branch || allowed.matches(&asked),
                "{asked} not allowed"
            );
            assert!(
                !paths_clash(&full, &branch.full_ref()),
                "{full} clashes with {branch}"
            );
            // The runtime rule for branches created next to existing ones agrees: the
            // configured branch is never in the way of an accepted ref.
            let configured = branch.full_ref();
            assert_eq!(branch_clash([configured.as_str()], &asked), None);
        }
        Err(refused) => assert!(!refused.to_string().contains('\n'), "one line"),
    }
}

/// Basic credentials: never panics; what it accepts round-trips.
pub fn basic_header(data: &[u8]) {
    if let Ok((user, secret)) = parse_basic(Some(data)) {
        assert!(!user.is_empty() && !user.contains(':'), "user {user:?}");
        assert!(!secret.expose().is_empty());
        let again = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{}", secret.expose()))
        );
        let (u, s) = parse_basic(Some(again.as_bytes())).expect("a re-encoded header parses");
        assert_eq!((u.as_str(), s.expose()), (user.as_str(), secret.expose()));
    }
}

/// pkt-lines, side-band, ref advertisements and push reports: errors, never panics, and the
/// reader always makes progress.
pub fn pkt_line(data: &[u8]) {
    let mut reader = pkt::Reader::new(data);
    let mut frames = 0usize;
    while let Ok(Some(_)) = reader.next_frame() {
        frames += 1;
        assert!(
            frames <= data.len() / 4 + 1,
            "the reader must consume input"
        );
    }
    let _ = pkt::demux(&mut pkt::Reader::new(data), None);
    let _ = PushReport::parse(data);
    let _ = Advert::parse(data, Service::UploadPack);
    let _ = Advert::parse(data, Service::ReceivePack);
}

/// The sops decoder: any bytes are either refused or parsed into a document (key groups of KMS,
/// age and OpenPGP entries, a threshold within them) whose decryption with a key it was not
/// sealed under fails (the MAC and GCM tags hold), never panics; the encrypted
/// value syntax round-trips; the passphrase reader refuses what it cannot authenticate.
pub fn sops_file(data: &[u8]) {
    let _ = gitstate_sops::looks_like_sops(data);
    if let Ok(document) = gitstate_sops::Document::parse(data) {
        let key = gitstate_sops::DataKey::new([7u8; 32]);
        let _ = document.is_binary();
        // key groups: the threshold never exceeds the groups, and every entry names its key
        assert!(document.needed() >= 1 && document.needed() <= document.groups.len().max(1));
        assert!(document.threshold <= document.groups.len());
        for group in &document.groups {
            assert_eq!(group.ids().count() + group.foreign, group.len());
        }
        // shares made of any bytes combine to some key or are refused, never a panic
        let shares: Vec<gitstate_sops::Unwrapped> = data
            .chunks(33)
            .take(4)
            .map(|c| gitstate_sops::Unwrapped::new(c.to_vec()))
            .collect();
        let _ = document.combine(&shares);
        // The MAC is always an AES-GCM value under the data key, so no input (short of one sealed
        // under this very key, which no mutation forges) decrypts.
        assert!(
            document.decrypt(&key).is_err(),
            "a document decrypted under a key it was not sealed under"
        );
    }
    sealed_value_opens_only_under_its_key(data);
    if let Ok(text) = std::str::from_utf8(data)
        && let Some(Ok(sealed)) = gitstate_sops::Sealed::parse(text)
    {
        let again = gitstate_sops::Sealed::parse(&sealed.render());
        assert!(
            matches!(again, Some(Ok(_))),
            "a parsed ENC[] value renders to one that parses"
        );
    }
    assert!(
        gitstate_sops::open_passphrase("fuzz", data).is_err() || data.len() >= 12 + 16,
        "an input shorter than nonce and tag never opens"
    );
}

/// `data` sealed as a sops value (the cipher every document value and MAC goes through) opens
/// under its key with its path to exactly `data`, and under another key, with another path, or
/// with any one byte of the rendered value changed it does not: so the document check above holds
/// on every input, not only on those that happen to parse.
fn sealed_value_opens_only_under_its_key(data: &[u8]) {
    use gitstate_sops::cipher;
    if data.is_empty() {
        return; // sops keeps empty values unencrypted
    }
    let key = gitstate_sops::DataKey::new([7u8; 32]);
    let mut other = [7u8; 32];
    other[usize::from(data[0]) % 32] ^= 1 << (data.len() % 8);
    let other = gitstate_sops::DataKey::new(other);
    let sealed = cipher::encrypt(&key, data, b"data:", "str").expect("sealing never fails");
    let opened = cipher::decrypt(&key, &sealed, b"data:").expect("opens under its own key");
    assert_eq!(opened.as_slice(), data, "opens to what was sealed");
    assert!(
        cipher::decrypt(&other, &sealed, b"data:").is_err(),
        "a value decrypted under a key it was not sealed under"
    );
    assert!(
        cipher::decrypt(&key, &sealed, b"other:").is_err(),
        "a value decrypted under another path"
    );
    // One byte of the rendered form changed (chosen by the input) within the data, IV or tag.
    let rendered = sealed.render();
    let at = "ENC[AES256_GCM,data:".len() + usize::from(data[data.len() - 1]) % 40;
    let mut changed = rendered.clone().into_bytes();
    changed[at] = if changed[at] == b'A' { b'B' } else { b'A' };
    if let Ok(changed) = String::from_utf8(changed)
        && let Some(Ok(forged)) = gitstate_sops::Sealed::parse(&changed)
        && forged != sealed
    {
        assert!(
            cipher::decrypt(&key, &forged, b"data:").is_err(),
            "a changed value still decrypted: {rendered} -> {changed}"
        );
    }
}

/// KMS key names: an accepted ARN prints back to exactly the input (nothing is normalised, so
/// what is checked is what is called), its parts hold the documented shapes, and a configured
/// name is an ARN exactly when it starts with `arn:`.
pub fn kms_arn(data: &[u8]) {
    use gitstate_sops::kms_key::{KeyArn, KeyName, KeyResource};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(arn) = KeyArn::parse(text) {
        assert_eq!(arn.to_string(), text, "printed back");
        assert_eq!(KeyArn::parse(&arn.to_string()).as_ref(), Ok(&arn));
        assert!(arn.partition == "aws" || arn.partition.starts_with("aws-"));
        assert!(
            arn.region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && arn.region.ends_with(|c: char| c.is_ascii_digit()),
            "region {:?}",
            arn.region
        );
        assert!(arn.account.len() == 12 && arn.account.bytes().all(|b| b.is_ascii_digit()));
        match &arn.resource {
            KeyResource::Key(id) => assert!(
                id.len() == 36 && (id.starts_with("mrk-") || id.matches('-').count() == 4),
                "key id {id:?}"
            ),
            KeyResource::Alias(name) => assert!(
                !name.is_empty()
                    && !name.to_ascii_lowercase().starts_with("aws/")
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"/_-".contains(&b)),
                "alias {name:?}"
            ),
        }
    }
    if let Ok(name) = KeyName::parse(text) {
        assert_eq!(name.to_string(), text, "printed back");
        assert_eq!(matches!(name, KeyName::Arn(_)), text.starts_with("arn:"));
    }
}
