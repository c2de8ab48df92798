//! `gitstate rekey`, `decrypt` and `encrypt`: the encryption of stored states, with the
//! deployment's own credentials (no backend in between).

use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail};
use gitstate_core::access::Caller;
use gitstate_core::service::Rekeyed;
use gitstate_core::{ReadContext, StateName};

use crate::settings::SettingsArgs;

pub async fn rekey(prefix: &str, args: &SettingsArgs) -> anyhow::Result<()> {
    let (_, settings) = args.settings()?;
    if !settings.encryption.has_write_keys() {
        bail!(
            "none of GITSTATE_KMS_KEY_IDS, GITSTATE_AGE_RECIPIENTS and GITSTATE_PGP_FINGERPRINTS names a key to re-encrypt under"
        );
    }
    let backend = gitstate_app::build_to_rekey(settings)
        .await
        .context("assembling the backend")?
        .backend;
    let at = backend.locate(None, None)?;
    let names = backend.store().list_states(&at, prefix).await?;
    let caller = Caller::operator("gitstate-rekey");
    let (total, mut failed) = (names.len(), 0);
    for (i, name) in names.iter().enumerate() {
        let outcome = match backend
            .rekey(&caller, &at, name, &ReadContext::no_request())
            .await
        {
            Ok(Rekeyed::Current) => "already current".to_owned(),
            Ok(Rekeyed::Rewritten { from }) => format!("re-encrypted (was {from})"),
            Ok(Rekeyed::Missing) => "gone".to_owned(),
            Err(error) => {
                failed += 1;
                format!("FAILED: {}", gitstate_core::report::chain(&error))
            }
        };
        eprintln!("[{}/{total}] {name}: {outcome}", i + 1);
    }
    eprintln!("rekey: {total} state(s), {failed} failed");
    if failed > 0 {
        bail!("{failed} state(s) could not be re-encrypted");
    }
    Ok(())
}

pub async fn decrypt(file: &Path, args: &SettingsArgs) -> anyhow::Result<()> {
    let (_, mut settings) = args.settings()?;
    let stored = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let kms = gitstate_kms::Kms::from_env().await;
    let team = settings.git.team.clone();
    gitstate_kms::open_private_keys(Some(&kms), team.as_deref(), &mut settings.encryption).await?;
    let sealer = gitstate_kms::SopsSealer::new(kms, &settings.encryption);
    let opened = sealer
        .envelope()
        .open(&stored, None)
        .await
        .and_then(|opened| gitstate_kms::unpack(opened, settings.limits.max_body_bytes))
        .with_context(|| format!("decrypting {}", file.display()))?;
    let mut out = std::io::stdout().lock();
    out.write_all(&opened.plaintext)?;
    out.flush()?;
    Ok(())
}

pub async fn encrypt(
    file: &Path,
    state: Option<String>,
    args: &SettingsArgs,
) -> anyhow::Result<()> {
    let (_, mut settings) = args.settings()?;
    if !settings.encryption.has_write_keys() {
        bail!(
            "none of GITSTATE_KMS_KEY_IDS, GITSTATE_AGE_RECIPIENTS and GITSTATE_PGP_FINGERPRINTS names a key to encrypt under"
        );
    }
    let name = StateName::parse(&state.unwrap_or_else(|| file.display().to_string()))
        .context("--state")?;
    let Some(repository) = settings.git.repository.clone() else {
        bail!("name the repository the state lives in: --repository or GITSTATE_REPOSITORY");
    };
    let plaintext = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let kms = gitstate_kms::Kms::from_env().await;
    // the OpenPGP public keys are parsed with the private ones
    let team = settings.git.team.clone();
    gitstate_kms::open_private_keys(Some(&kms), team.as_deref(), &mut settings.encryption).await?;
    let sealer = gitstate_kms::SopsSealer::new(kms, &settings.encryption);
    std::str::from_utf8(&plaintext).context("the state is not UTF-8 text")?;
    let payload = gitstate_kms::pack(&plaintext).context("compressing")?;
    let sealed = sealer
        .envelope()
        .seal(&payload, &gitstate_kms::context(&repository, &name))
        .await
        .context("encrypting")?;
    let mut out = std::io::stdout().lock();
    out.write_all(&sealed)?;
    out.flush()?;
    Ok(())
}
