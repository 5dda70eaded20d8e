//! A lambda's `requirements.txt`: parsed, checked for pinning, and put in a canonical form
//! that names the set of packages the lambda asked for.
//!
//! Accepted lines are PEP 508 requirements (`name[extra]==1.2.3 ; marker`), comments and blank
//! lines. Pinned means exactly one `==` (or `===`) specifier with a version and no wildcard;
//! anything else (`>=`, `~=`, `==1.*`, a bare name) is unpinned. Options (`-r`, `-e`,
//! `--index-url`), URLs and paths are refused: where packages come from is the worker's
//! configuration, not the lambda's.

use std::fmt;

/// One requirement line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The name as written.
    pub name: String,
    /// PEP 503 normalized name (lowercase, runs of `-_.` as one `-`).
    pub normalized: String,
    /// Extras, sorted.
    pub extras: Vec<String>,
    /// The version specifiers, e.g. `==4.2.7` or `>=2,<3` (empty for a bare name).
    pub specifier: String,
    /// The environment marker after `;`, if any.
    pub marker: Option<String>,
    /// 1-based line number in the file.
    pub line: usize,
}

impl Requirement {
    /// The pinned version, when the requirement pins one.
    pub fn pinned_version(&self) -> Option<&str> {
        let spec = self.specifier.trim();
        let version = spec.strip_prefix("===").or_else(|| spec.strip_prefix("=="))?.trim();
        let ok = !version.is_empty()
            && !version.contains(['*', ',', '<', '>', '!', '~', '=', ' '])
            && version.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+'));
        ok.then_some(version)
    }

    /// The line as pip reads it, in canonical form.
    pub fn canonical(&self) -> String {
        let mut out = self.normalized.clone();
        if !self.extras.is_empty() {
            out.push_str(&format!("[{}]", self.extras.join(",")));
        }
        out.push_str(&self.specifier.replace(' ', ""));
        if let Some(m) = &self.marker {
            out.push_str(&format!(" ; {m}"));
        }
        out
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

/// Why a requirements file was refused; `code` is the API's error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementsError {
    #[error("requirements.txt line {line}: {message}")]
    Invalid { line: usize, message: String },
    #[error("requirements.txt pins no version on {}: write name==version for each package (pip-compile makes such a file)", describe(.0))]
    Unpinned(Vec<(usize, String)>),
    #[error("requirements.txt names {0:?} more than once")]
    Duplicate(String),
}

fn describe(lines: &[(usize, String)]) -> String {
    lines.iter().map(|(n, l)| format!("line {n} ({l:?})")).collect::<Vec<_>>().join(", ")
}

impl RequirementsError {
    pub fn code(&self) -> crate::errors::ErrorCode {
        match self {
            RequirementsError::Unpinned(_) => crate::errors::ErrorCode::UnpinnedRequirements,
            _ => crate::errors::ErrorCode::InvalidRequirements,
        }
    }
}

/// PEP 503 normalization.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut dash = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            dash = true;
        } else {
            if dash && !out.is_empty() {
                out.push('-');
            }
            dash = false;
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Parse a requirements file. With `allow_unpinned`, unpinned lines are accepted (pip then
/// resolves them to the newest versions that fit).
pub fn parse(text: &str, allow_unpinned: bool) -> Result<Vec<Requirement>, RequirementsError> {
    let mut out: Vec<Requirement> = Vec::new();
    let mut unpinned = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let content = match raw.find(" #").or_else(|| raw.trim_start().starts_with('#').then_some(0)) {
            Some(i) => &raw[..i],
            None => raw,
        }
        .trim();
        if content.is_empty() {
            continue;
        }
        let invalid = |message: &str| RequirementsError::Invalid { line, message: message.to_string() };
        if content.starts_with('-') {
            return Err(invalid("options (-r, -e, --index-url, ...) are not accepted; list packages as name==version"));
        }
        if content.contains("://") || content.contains(" @ ") || content.starts_with('.') || content.starts_with('/') {
            return Err(invalid("URLs and paths are not accepted; list packages as name==version"));
        }
        if content.ends_with('\\') {
            return Err(invalid("line continuations are not accepted"));
        }
        let (requirement, marker) = match content.split_once(';') {
            Some((r, m)) => (r.trim(), Some(m.trim().to_string()).filter(|m| !m.is_empty())),
            None => (content, None),
        };
        let name_end =
            requirement.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))).unwrap_or(requirement.len());
        let name = &requirement[..name_end];
        if !valid_name(name) {
            return Err(invalid(&format!("{content:?} does not start with a package name")));
        }
        let mut rest = requirement[name_end..].trim_start();
        let mut extras = Vec::new();
        if let Some(after) = rest.strip_prefix('[') {
            let Some((inside, tail)) = after.split_once(']') else {
                return Err(invalid("unclosed [ of extras"));
            };
            for extra in inside.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                if !valid_name(extra) {
                    return Err(invalid(&format!("invalid extra {extra:?}")));
                }
                extras.push(normalize(extra));
            }
            extras.sort();
            rest = tail.trim_start();
        }
        let specifier = rest.trim().to_string();
        if !specifier.is_empty() && !specifier.starts_with(['=', '<', '>', '!', '~', '(']) {
            return Err(invalid(&format!("unexpected {specifier:?} after the package name")));
        }
        let req = Requirement { name: name.to_string(), normalized: normalize(name), extras, specifier, marker, line };
        if out.iter().any(|r| r.normalized == req.normalized) {
            return Err(RequirementsError::Duplicate(req.name));
        }
        if req.pinned_version().is_none() {
            unpinned.push((line, content.to_string()));
        }
        out.push(req);
    }
    if !unpinned.is_empty() && !allow_unpinned {
        return Err(RequirementsError::Unpinned(unpinned));
    }
    out.sort_by(|a, b| a.normalized.cmp(&b.normalized));
    Ok(out)
}

/// Release segments of a plain version ("1.26.4" -> [1, 26, 4]); None for pre-releases,
/// local versions and anything else this check leaves to pip.
fn release(version: &str) -> Option<Vec<u64>> {
    let v = version.trim().trim_start_matches('v');
    let v = v.split_once('!').map(|(_, r)| r).unwrap_or(v);
    let v = v.strip_suffix(".post0").unwrap_or(v);
    v.split('.').map(|part| part.parse::<u64>().ok()).collect()
}

fn compare(a: &[u64], b: &[u64]) -> std::cmp::Ordering {
    let n = a.len().max(b.len());
    let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    (0..n).map(|i| at(a, i).cmp(&at(b, i))).find(|o| o.is_ne()).unwrap_or(std::cmp::Ordering::Equal)
}

/// Whether `version` meets a PEP 440 specifier such as `>=1.0,<3` or `~=2.1`; None when the
/// versions or operators are beyond this simple check (pip then decides).
pub fn satisfies(version: &str, specifier: &str) -> Option<bool> {
    use std::cmp::Ordering::*;
    let have = release(version)?;
    let spec = specifier.trim().trim_start_matches('(').trim_end_matches(')');
    for clause in spec.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        let op_len = clause.find(|c: char| c.is_ascii_alphanumeric()).unwrap_or(clause.len());
        let (op, want) = (clause[..op_len].trim(), clause[op_len..].trim());
        if let Some(prefix) = want.strip_suffix(".*") {
            let want = release(prefix)?;
            let same = have.len() >= want.len() && have[..want.len()] == want[..];
            match op {
                "==" if !same => return Some(false),
                "!=" if same => return Some(false),
                "==" | "!=" => continue,
                _ => return None,
            }
        }
        let want = release(want)?;
        let order = compare(&have, &want);
        let ok = match op {
            "==" | "===" => order == Equal,
            "!=" => order != Equal,
            ">=" => order != Less,
            "<=" => order != Greater,
            ">" => order == Greater,
            "<" => order == Less,
            "~=" if want.len() >= 2 => order != Less && have.len() >= want.len() - 1 && have[..want.len() - 1] == want[..want.len() - 1],
            _ => return None,
        };
        if !ok {
            return Some(false);
        }
    }
    Some(true)
}

/// The canonical text of a requirement set: one sorted line each (the key of its resolution).
pub fn canonical_text(reqs: &[Requirement]) -> String {
    reqs.iter().map(|r| r.canonical() + "\n").collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_lines_parse_into_canonical_form() {
        let reqs = parse(
            "# deps\nDjango==4.2.7  # web\n\nzope.interface == 6.1\nrequests[Socks,security]==2.31.0 ; python_version >= '3.8'\n",
            false,
        )
        .unwrap();
        let text = canonical_text(&reqs);
        assert_eq!(text, "django==4.2.7\nrequests[security,socks]==2.31.0 ; python_version >= '3.8'\nzope-interface==6.1\n");
        assert_eq!(reqs[0].pinned_version(), Some("4.2.7"));
        assert_eq!(reqs[0].line, 2);
    }

    #[test]
    fn unpinned_lines_are_named_with_their_numbers() {
        let err = parse("flask==3.0.0\nnumpy>=1.26\nrequests\npillow==10.*\n", false).unwrap_err();
        assert_eq!(err.code().as_str(), "unpinned_requirements");
        let message = err.to_string();
        for part in ["line 2", "numpy>=1.26", "line 3", "requests", "line 4", "pillow==10.*"] {
            assert!(message.contains(part), "{message}");
        }
        assert!(!message.contains("line 1"), "{message}");
        assert_eq!(parse("numpy>=1.26\n", true).unwrap()[0].pinned_version(), None);
    }

    #[test]
    fn options_urls_and_garbage_are_invalid() {
        for bad in [
            "-r other.txt",
            "--index-url http://x",
            "-e .",
            "pkg @ https://x/y.whl",
            "https://x/y.whl",
            "./local",
            "==1.0",
            "pkg[oops==1",
            "pkg 1.0",
        ] {
            let err = parse(bad, true).unwrap_err();
            assert_eq!(err.code().as_str(), "invalid_requirements", "{bad}: {err}");
            assert!(err.to_string().contains("line 1"), "{bad}: {err}");
        }
        assert!(matches!(parse("a==1\nA==2\n", false), Err(RequirementsError::Duplicate(_))));
    }

    #[test]
    fn simple_specifiers_are_checked_and_the_rest_left_to_pip() {
        assert_eq!(satisfies("2.31.0", ">=2.0,<3"), Some(true));
        assert_eq!(satisfies("3.0", ">=2.0,<3"), Some(false));
        assert_eq!(satisfies("1.26.4", "~=1.26"), Some(true));
        assert_eq!(satisfies("2.0", "~=1.26"), Some(false));
        assert_eq!(satisfies("4.2.7", "==4.2.*"), Some(true));
        assert_eq!(satisfies("4.3", "==4.2.*"), Some(false));
        assert_eq!(satisfies("1.0", "!=1.0.0"), Some(false));
        assert_eq!(satisfies("1.0", "(>=0.9)"), Some(true));
        assert_eq!(satisfies("1.0", ""), Some(true));
        assert_eq!(satisfies("2.0b1", ">=1"), None);
        assert_eq!(satisfies("1.0", "===weird"), None);
    }

    #[test]
    fn normalization_follows_pep_503() {
        assert_eq!(normalize("Zope.Interface"), "zope-interface");
        assert_eq!(normalize("typing__extensions"), "typing-extensions");
        assert_eq!(normalize("Pillow"), "pillow");
    }
}
