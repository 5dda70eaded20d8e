//! Unpacking an uploaded lambda (a tar.gz of its directory) safely.
//!
//! Every entry is checked before anything is written: paths must stay inside the lambda's
//! directory (no absolute paths, no `..`), symbolic links must point inside it too, hard
//! links, devices and FIFOs are refused, and the number of files and the bytes actually
//! unpacked are capped, so a small upload cannot expand without bound. An archive whose only
//! top-level entry is a directory holding f.py or ol.yaml is taken as that directory; [`check_entry`]
//! checks that the lambda has its entry file.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use flate2::read::GzDecoder;

use crate::errors::ErrorCode;

/// What an archive may unpack to.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub max_bytes: u64,
    pub max_files: usize,
}

/// Why an upload was refused; `code` is the stable error code of the API.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("the upload is not a gzip-compressed tar archive")]
    NotGzip,
    #[error("the archive is corrupt: {0}")]
    Corrupt(String),
    #[error("unsafe path in the archive: {0}")]
    UnsafePath(String),
    #[error("the archive holds an entry of a kind lambdas may not contain: {0}")]
    Unsupported(String),
    #[error("the archive unpacks to more than {0}")]
    TooLarge(String),
    #[error("the archive has no {0} at its top level")]
    MissingHandler(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl ArchiveError {
    pub fn code(&self) -> ErrorCode {
        match self {
            ArchiveError::NotGzip | ArchiveError::Corrupt(_) => ErrorCode::InvalidArchive,
            ArchiveError::UnsafePath(_) | ArchiveError::Unsupported(_) => ErrorCode::UnsafePath,
            ArchiveError::TooLarge(_) => ErrorCode::ArchiveTooLarge,
            ArchiveError::MissingHandler(_) => ErrorCode::MissingHandler,
            ArchiveError::Io(_) => ErrorCode::Internal,
        }
    }
}

/// What was unpacked.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unpacked {
    pub files: usize,
    pub bytes: u64,
}

/// The entry's path relative to the lambda directory, if it stays inside it.
fn safe_relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Whether a symlink at `link` (relative to the root) pointing to `target` stays inside.
fn link_stays_inside(link: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth: Vec<&std::ffi::OsStr> = link
        .parent()
        .map(|p| p.components().filter_map(|c| if let Component::Normal(n) = c { Some(n) } else { None }).collect())
        .unwrap_or_default();
    for c in target.components() {
        match c {
            Component::Normal(n) => depth.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                if depth.pop().is_none() {
                    return false;
                }
            }
            _ => return false,
        }
    }
    true
}

/// Unpack `data` (tar.gz) into `dest`, which must exist and be empty.
pub fn unpack(data: &[u8], dest: &Path, caps: Caps) -> Result<Unpacked, ArchiveError> {
    if data.len() < 2 || data[0] != 0x1f || data[1] != 0x8b {
        return Err(ArchiveError::NotGzip);
    }
    let mut archive = tar::Archive::new(GzDecoder::new(data));
    let mut total = Unpacked::default();
    let corrupt = |e: io::Error| ArchiveError::Corrupt(e.to_string());
    for entry in archive.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        let raw = entry.path().map_err(corrupt)?.into_owned();
        let rel = safe_relative(&raw).ok_or_else(|| ArchiveError::UnsafePath(raw.display().to_string()))?;
        if rel.as_os_str().is_empty() {
            continue; // "./" itself
        }
        let target = dest.join(&rel);
        let kind = entry.header().entry_type();
        total.files += 1;
        if total.files > caps.max_files {
            return Err(ArchiveError::TooLarge(format!("{} files", caps.max_files)));
        }
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        match kind {
            tar::EntryType::Directory => {
                fs::create_dir_all(&target)?;
                fs::set_permissions(&target, fs::Permissions::from_mode(0o755))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let executable = entry.header().mode().map(|m| m & 0o111 != 0).unwrap_or(false);
                let mut out = fs::File::create(&target)?;
                let budget = caps.max_bytes.saturating_sub(total.bytes);
                let copied = io::copy(&mut (&mut entry).take(budget + 1), &mut out).map_err(corrupt)?;
                total.bytes += copied;
                if total.bytes > caps.max_bytes {
                    return Err(ArchiveError::TooLarge(format!("{} MiB", caps.max_bytes >> 20)));
                }
                out.flush()?;
                fs::set_permissions(&target, fs::Permissions::from_mode(if executable { 0o755 } else { 0o644 }))?;
            }
            tar::EntryType::Symlink => {
                let link = entry.link_name().map_err(corrupt)?.ok_or_else(|| ArchiveError::Corrupt("symlink without target".into()))?;
                if !link_stays_inside(&rel, &link) {
                    return Err(ArchiveError::UnsafePath(format!("{} -> {}", raw.display(), link.display())));
                }
                std::os::unix::fs::symlink(&link, &target)?;
            }
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader | tar::EntryType::GNULongName | tar::EntryType::GNULongLink => {
                total.files -= 1;
            }
            tar::EntryType::Link => {
                return Err(ArchiveError::Unsupported(format!("hard link {}", raw.display())));
            }
            other => return Err(ArchiveError::Unsupported(format!("{:?} {}", other, raw.display()))),
        }
    }
    hoist_single_directory(dest)?;
    Ok(total)
}

/// Check that the lambda unpacked at `dest` has its entry file, a regular file, at its top.
pub fn check_entry(dest: &Path, entry: &str) -> Result<(), ArchiveError> {
    match fs::symlink_metadata(dest.join(entry)) {
        Ok(m) if m.is_file() => Ok(()),
        _ => Err(ArchiveError::MissingHandler(entry.to_string())),
    }
}

/// `tar czf echo.tgz echo/` puts everything under `echo/`: a top level that is one directory
/// holding an entry file (f.py) or a configuration (ol.yaml) is taken as that directory.
fn hoist_single_directory(dest: &Path) -> io::Result<()> {
    let entries: Vec<_> = fs::read_dir(dest)?.collect::<io::Result<_>>()?;
    let lambda_like = |dir: &Path| dir.join("f.py").is_file() || dir.join(super::lambda_config::FILE_NAME).is_file();
    if entries.len() != 1 || !entries[0].file_type()?.is_dir() || !lambda_like(&entries[0].path()) {
        return Ok(());
    }
    let inner = entries[0].path();
    let staging = dest.join(".sprout-hoist");
    fs::rename(&inner, &staging)?;
    for e in fs::read_dir(&staging)? {
        let e = e?;
        fs::rename(e.path(), dest.join(e.file_name()))?;
    }
    fs::remove_dir(&staging)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targz(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        let tar = b.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        gz.finish().unwrap()
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        // set_path refuses "..", so write the name bytes directly as a hostile client would
        let name = &mut h.as_old_mut().name;
        name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn link(b: &mut tar::Builder<Vec<u8>>, path: &str, target: &str, kind: tar::EntryType) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_path(path).unwrap();
        h.set_link_name(target).unwrap();
        h.set_cksum();
        b.append(&h, &[][..]).unwrap();
    }

    const CAPS: Caps = Caps { max_bytes: 1 << 20, max_files: 100 };

    fn unpack_new(data: &[u8]) -> (tempfile::TempDir, Result<Unpacked, ArchiveError>) {
        let dir = tempfile::tempdir().unwrap();
        let result = unpack(data, dir.path(), CAPS);
        (dir, result)
    }

    #[test]
    fn unpacks_a_plain_lambda() {
        let data = targz(|b| {
            file(b, "f.py", b"def f(e): return e\n");
            file(b, "lib/util.py", b"X = 1\n");
        });
        let (dir, r) = unpack_new(&data);
        assert_eq!(r.unwrap().files, 2);
        assert!(dir.path().join("lib/util.py").is_file());
    }

    #[test]
    fn hoists_a_single_top_level_directory() {
        let data = targz(|b| file(b, "echo/f.py", b"def f(e): return e\n"));
        let (dir, r) = unpack_new(&data);
        r.unwrap();
        assert!(dir.path().join("f.py").is_file());
    }

    #[test]
    fn refuses_what_is_not_targz() {
        assert_eq!(unpack_new(b"plain text").1.unwrap_err().code().as_str(), "invalid_archive");
        let mut bad = targz(|b| file(b, "f.py", b"x"));
        bad.truncate(bad.len() / 2);
        assert_eq!(unpack_new(&bad).1.unwrap_err().code().as_str(), "invalid_archive");
    }

    #[test]
    fn refuses_escaping_paths_and_links() {
        let up = targz(|b| file(b, "../evil.py", b"x"));
        assert_eq!(unpack_new(&up).1.unwrap_err().code().as_str(), "unsafe_path");
        let abs = targz(|b| file(b, "/etc/evil", b"x"));
        assert_eq!(unpack_new(&abs).1.unwrap_err().code().as_str(), "unsafe_path");
        let out = targz(|b| {
            file(b, "f.py", b"x");
            link(b, "data", "../../etc", tar::EntryType::Symlink);
        });
        assert_eq!(unpack_new(&out).1.unwrap_err().code().as_str(), "unsafe_path");
        let abs_link = targz(|b| link(b, "passwd", "/etc/passwd", tar::EntryType::Symlink));
        assert_eq!(unpack_new(&abs_link).1.unwrap_err().code().as_str(), "unsafe_path");
        let hard = targz(|b| link(b, "shadow", "/etc/shadow", tar::EntryType::Link));
        assert_eq!(unpack_new(&hard).1.unwrap_err().code().as_str(), "unsafe_path");
    }

    #[test]
    fn accepts_links_that_stay_inside() {
        let data = targz(|b| {
            file(b, "f.py", b"x");
            file(b, "lib/a.py", b"x");
            link(b, "lib/b.py", "../lib/a.py", tar::EntryType::Symlink);
        });
        unpack_new(&data).1.unwrap();
    }

    #[test]
    fn the_entry_file_must_be_a_file_at_the_top() {
        let data = targz(|b| {
            file(b, "main.py", b"x");
            file(b, "sub/f.py", b"x");
        });
        let (dir, unpacked) = unpack_new(&data);
        unpacked.unwrap();
        let e = check_entry(dir.path(), "f.py").unwrap_err();
        assert_eq!((e.code().as_str(), e.to_string().as_str()), ("missing_handler", "the archive has no f.py at its top level"));
        check_entry(dir.path(), "main.py").unwrap();
    }

    #[test]
    fn hoists_a_directory_holding_only_a_configuration_and_its_entry() {
        let data = targz(|b| {
            file(b, "site/ol.yaml", b"environment:\n  OL_ENTRY_FILE: app.py\n");
            file(b, "site/app.py", b"app = None\n");
        });
        let (dir, unpacked) = unpack_new(&data);
        unpacked.unwrap();
        assert!(dir.path().join("app.py").is_file() && dir.path().join("ol.yaml").is_file());
    }

    #[test]
    fn caps_unpacked_size_and_file_count() {
        let big = vec![b'a'; (2 << 20) as usize];
        let data = targz(|b| file(b, "f.py", &big));
        assert!(data.len() < 100_000, "compresses well, as a zip bomb would");
        assert_eq!(unpack_new(&data).1.unwrap_err().code().as_str(), "archive_too_large");
        let many = targz(|b| {
            for i in 0..150 {
                file(b, &format!("m{i}.py"), b"x");
            }
        });
        assert_eq!(unpack_new(&many).1.unwrap_err().code().as_str(), "archive_too_large");
    }
}
