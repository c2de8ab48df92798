//! The Terraform configuration that points at this router: its addresses and lock methods are
//! the routes of [`crate::states`] and [`crate::locks`], so it lives beside them.

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

/// Print the `backend "http"` block that points Terraform at `base` for `state`.
pub fn write_backend_block(
    out: &mut impl std::io::Write,
    base: &str,
    state: &str,
) -> std::io::Result<()> {
    writeln!(out, "\n{}", backend_block(base, state, None))
}

/// The `backend "http"` block for `state` at `base`, on `branch` when it is given (`?ref=`,
/// percent-encoded, on every address).
pub(crate) fn backend_block(base: &str, state: &str, branch: Option<&str>) -> String {
    let base = base.trim_end_matches('/');
    let query = branch.map_or_else(String::new, |b| {
        format!("?ref={}", utf8_percent_encode(b, NON_ALPHANUMERIC))
    });
    format!(
        r#"terraform {{
  backend "http" {{
    address        = "{base}/states/{state}{query}"
    lock_address   = "{base}/locks/{state}{query}"
    unlock_address = "{base}/locks/{state}{query}"
    lock_method    = "POST"
    unlock_method  = "DELETE"
  }}
}}"#
    )
}
