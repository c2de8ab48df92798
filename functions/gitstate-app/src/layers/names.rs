//! Names of settings as a user types them: the nearest known one to a misspelt name, and the
//! check of the `GITSTATE_*` environment.

use super::{LayerError, OTHER_VARIABLES, SETTINGS};

/// The known name nearest to `name` (edit distance, ignoring case and `-`/`_`), among the
/// variables when `name` looks like one (`GITSTATE_…`), else among the file keys.
pub fn nearest(name: &str) -> Option<String> {
    let normal = |s: &str| s.to_ascii_lowercase().replace('-', "_");
    let wanted = normal(
        name.trim_start_matches("GITSTATE_")
            .trim_start_matches("gitstate_"),
    );
    let variable = name.to_ascii_uppercase().starts_with("GITSTATE_");
    let candidates = SETTINGS
        .iter()
        .map(|s| (s.key(), s.var.to_owned()))
        .chain(OTHER_VARIABLES.iter().map(|v| {
            (
                v.trim_start_matches("GITSTATE_").to_ascii_lowercase(),
                (*v).to_owned(),
            )
        }))
        .filter(|(key, _)| variable || SETTINGS.iter().any(|s| s.key() == *key));
    candidates
        .map(|(key, var)| {
            let distance = strsim::damerau_levenshtein(&wanted, &key);
            (distance, if variable { var } else { key })
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name)
}

/// ` (did you mean `X`?)` for an unknown name, or nothing when no name is near.
fn hint(name: &str) -> String {
    nearest(name).map_or_else(String::new, |n| format!(" (did you mean `{n}`?)"))
}

/// Every `GITSTATE_*` variable of `vars` is a known one; with `allow_empty` false, none is set to
/// an empty value (an empty CI secret would otherwise silently mean the default). Lambda allows
/// empties: its template passes unset parameters as empty strings. Every problem is named.
pub fn check_environment(
    vars: impl IntoIterator<Item = (String, String)>,
    allow_empty: bool,
) -> Result<(), LayerError> {
    let mut problems = Vec::new();
    for (var, value) in vars {
        if !var.starts_with("GITSTATE_") {
            continue;
        }
        let known =
            SETTINGS.iter().any(|s| s.var == var) || OTHER_VARIABLES.contains(&var.as_str());
        if !known {
            problems.push(format!("unknown variable {var}{}", hint(&var)));
        } else if !allow_empty && value.trim().is_empty() {
            problems.push(format!(
                "{var} is set but empty: give it a value or unset it"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        problems.sort();
        Err(LayerError::Environment(problems.join("; ")))
    }
}
