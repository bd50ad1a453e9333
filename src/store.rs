//! Stage 1, write (stub, being written).
use anyhow::{bail, Result};

/// client_ruby's label-name rule: `[a-zA-Z_][a-zA-Z0-9_]*`, not `__`-prefixed, not reserved.
pub fn validate_label_name(name: &str, reserved: &[&str]) -> Result<()> {
    let mut bytes = name.bytes();
    let valid = matches!(bytes.next(), Some(b'a'..=b'z' | b'A'..=b'Z' | b'_'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        bail!("label name {name:?} does not match [a-zA-Z_][a-zA-Z0-9_]*");
    }
    if name.starts_with("__") {
        bail!("label name {name:?} starts with __, which is reserved");
    }
    if reserved.contains(&name) {
        bail!("label name {name:?} is reserved");
    }
    Ok(())
}
