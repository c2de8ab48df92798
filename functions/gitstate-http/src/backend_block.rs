//! The Terraform configuration that points at this router: its addresses and lock methods are
//! the routes of [`crate::states`] and [`crate::locks`], so it lives beside them.

/// Print the `backend "http"` block that points Terraform at `base` for `state`.
pub fn write_backend_block(
    out: &mut impl std::io::Write,
    base: &str,
    state: &str,
) -> std::io::Result<()> {
    let base = base.trim_end_matches('/');
    writeln!(
        out,
        r#"
terraform {{
  backend "http" {{
    address        = "{base}/states/{state}"
    lock_address   = "{base}/locks/{state}"
    unlock_address = "{base}/locks/{state}"
    lock_method    = "POST"
    unlock_method  = "DELETE"
  }}
}}"#
    )
}
