//! What a lambda may be called: 1-64 letters, digits, '-', '_' and '.', starting with a
//! letter or digit (so a name is a safe file name, URL segment and cgroup name).

/// Whether `name` is a lambda's name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().next().map(|c| c.is_ascii_alphanumeric()).unwrap_or(false)
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}
