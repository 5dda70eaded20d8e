//! The worker's API token on disk: the secret `DIR/api-token`, and the copy a running worker
//! leaves in `/run/sprout/api/<listen address>` for clients on the same machine to find.
//!
//! `DIR/api-token` is made once (32 random bytes as 64 hex digits, mode 0600) and never
//! overwritten, so a restart keeps the token. The discovery copy is written at start (over a
//! stale one a killed worker left) and removed at a clean stop; removing one only ever removes
//! a file that still holds this worker's token, never another worker's.

use std::fmt;
use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The token's file in a worker directory.
pub const TOKEN_FILE: &str = "api-token";
/// Where running workers publish their tokens, one file per listen address.
pub const DISCOVERY_DIR: &str = "/run/sprout/api";

const TOKEN_BYTES: usize = 32;

/// A worker's API token: 64 lowercase hex digits. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// A new token from the kernel's random source.
    pub fn generate() -> Result<Token> {
        let mut bytes = [0u8; TOKEN_BYTES];
        fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).context("reading /dev/urandom")?;
        Ok(Token(hex::encode(bytes)))
    }

    /// A token as written in a file (surrounding white space ignored), if it is one.
    pub fn parse(text: &str) -> Option<Token> {
        let text = text.trim();
        (text.len() == 2 * TOKEN_BYTES && text.bytes().all(|b| b.is_ascii_hexdigit())).then(|| Token(text.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

/// Whether two tokens are equal, in time that depends only on their lengths (a token's
/// length is no secret: every one has 64 digits).
pub fn same_token(presented: &[u8], expected: &[u8]) -> bool {
    if presented.len() != expected.len() {
        return false;
    }
    let difference = presented.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(difference) == 0
}

/// `DIR/api-token`.
pub fn token_path(dir: &Path) -> PathBuf {
    dir.join(TOKEN_FILE)
}

/// Read `DIR/api-token`, making it first when it is missing; true when it was made now.
/// An existing file is never replaced; one readable by others is made 0600 again.
pub fn ensure_token(dir: &Path) -> Result<(Token, bool)> {
    let path = token_path(dir);
    match fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
        Ok(mut file) => {
            let written = Token::generate().and_then(|token| {
                file.write_all(token.as_str().as_bytes()).and_then(|_| file.sync_all())?;
                Ok(token)
            });
            if written.is_err() {
                let _ = fs::remove_file(&path); // never leave a file that holds no token
            }
            Ok((written.with_context(|| format!("writing {}", path.display()))?, true))
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok((read_token(dir)?, false)),
        Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
    }
}

/// Read `DIR/api-token` as it is.
pub fn read_token(dir: &Path) -> Result<Token> {
    let path = token_path(dir);
    let mode = fs::metadata(&path).with_context(|| format!("reading {}", path.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        tracing::warn!("{} was readable by others (mode {:o}); making it 0600", path.display(), mode & 0o777);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).with_context(|| format!("chmod 0600 {}", path.display()))?;
    }
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    match Token::parse(&text) {
        Some(token) => Ok(token),
        None => bail!("{} does not hold a token (64 hex digits); remove it and a new one is made", path.display()),
    }
}

/// The file a worker listening on `addr` publishes its token in: `/run/sprout/api/127.0.0.1:5000`.
pub fn discovery_path(addr: &SocketAddr) -> PathBuf {
    Path::new(DISCOVERY_DIR).join(addr.to_string())
}

/// The addresses a client reaches a worker listening on `listen` by: the address itself and,
/// for a wildcard address, the loopback ones on its port.
fn discovery_names(listen: SocketAddr) -> Vec<SocketAddr> {
    let mut names = vec![listen];
    if listen.ip().is_unspecified() {
        if listen.is_ipv6() {
            names.push(SocketAddr::new(Ipv6Addr::LOCALHOST.into(), listen.port()));
        }
        names.push(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), listen.port()));
    }
    names
}

/// The token's copies under `/run/sprout/api` while the worker runs; dropping it removes them
/// (those that still hold this token).
pub struct Discovery {
    files: Vec<PathBuf>,
    token: Token,
}

impl Discovery {
    /// Write the token for every name of `listen` (directory 0700, files 0600), replacing
    /// what a killed worker left.
    pub fn publish(listen: SocketAddr, token: &Token) -> Result<Discovery> {
        Discovery::publish_in(Path::new(DISCOVERY_DIR), listen, token)
    }

    fn publish_in(base: &Path, listen: SocketAddr, token: &Token) -> Result<Discovery> {
        fs::create_dir_all(base).with_context(|| format!("creating {}", base.display()))?;
        fs::set_permissions(base, fs::Permissions::from_mode(0o700)).with_context(|| format!("chmod 0700 {}", base.display()))?;
        let mut discovery = Discovery { files: Vec::new(), token: token.clone() };
        for name in discovery_names(listen) {
            let path = base.join(name.to_string());
            let staged = base.join(format!(".{name}.{}", std::process::id()));
            let written = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&staged)
                .and_then(|mut f| f.write_all(token.as_str().as_bytes()))
                .and_then(|_| fs::rename(&staged, &path));
            if let Err(e) = written {
                let _ = fs::remove_file(&staged);
                return Err(e).with_context(|| format!("writing {}", path.display()));
            }
            discovery.files.push(path);
        }
        Ok(discovery)
    }

    /// The files written.
    #[cfg(test)]
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        for path in &self.files {
            remove_if_holding(path, &self.token);
        }
    }
}

/// Remove the copies of `token` a worker that listened on `listen` left behind (after a
/// kill -9); copies now holding another worker's token stay.
pub fn withdraw(listen: SocketAddr, token: &Token) -> usize {
    withdraw_in(Path::new(DISCOVERY_DIR), listen, token)
}

fn withdraw_in(base: &Path, listen: SocketAddr, token: &Token) -> usize {
    discovery_names(listen).into_iter().filter(|name| remove_if_holding(&base.join(name.to_string()), token)).count()
}

fn remove_if_holding(path: &Path, token: &Token) -> bool {
    let holds = fs::read_to_string(path).ok().and_then(|text| Token::parse(&text)).is_some_and(|t| t == *token);
    holds && fs::remove_file(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_token_is_made_once_private_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (first, made) = ensure_token(dir.path()).unwrap();
        assert!(made && first.as_str().len() == 64);
        assert_eq!(mode(&token_path(dir.path())), 0o600);
        let (again, made) = ensure_token(dir.path()).unwrap();
        assert!(!made && again == first);
        assert_ne!(Token::generate().unwrap(), first);
    }

    #[test]
    fn a_file_that_holds_no_token_is_an_error_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(token_path(dir.path()), "secret").unwrap();
        let err = ensure_token(dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains("64 hex digits"), "{err:#}");
        assert_eq!(fs::read_to_string(token_path(dir.path())).unwrap(), "secret");
    }

    #[test]
    fn a_token_readable_by_others_is_made_private() {
        let dir = tempfile::tempdir().unwrap();
        let token = Token::generate().unwrap();
        fs::write(token_path(dir.path()), format!("{}\n", token.as_str())).unwrap();
        fs::set_permissions(token_path(dir.path()), fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read_token(dir.path()).unwrap(), token);
        assert_eq!(mode(&token_path(dir.path())), 0o600);
    }

    #[test]
    fn debug_never_shows_the_token() {
        let token = Token::generate().unwrap();
        assert!(!format!("{token:?}").contains(token.as_str()));
    }

    #[test]
    fn discovery_files_are_private_and_removed_only_while_they_hold_our_token() {
        let base = tempfile::tempdir().unwrap();
        let base = base.path().join("api");
        let listen: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let (ours, theirs) = (Token::generate().unwrap(), Token::generate().unwrap());
        let published = Discovery::publish_in(&base, listen, &ours).unwrap();
        let file = base.join("127.0.0.1:5000");
        assert_eq!(published.files(), std::slice::from_ref(&file));
        assert_eq!((mode(&base), mode(&file)), (0o700, 0o600));
        assert_eq!(fs::read_to_string(&file).unwrap(), ours.as_str());
        drop(published);
        assert!(!file.exists());

        let stale = Discovery::publish_in(&base, listen, &ours).unwrap();
        std::mem::forget(stale); // a worker killed with -9
        let next = Discovery::publish_in(&base, listen, &theirs).unwrap();
        assert_eq!(withdraw_in(&base, listen, &ours), 0, "another worker's token stays");
        assert_eq!(fs::read_to_string(&file).unwrap(), theirs.as_str());
        std::mem::forget(next);
        assert_eq!(withdraw_in(&base, listen, &theirs), 1);
        assert!(!file.exists());
    }

    #[test]
    fn a_wildcard_listener_is_also_found_by_its_loopback_addresses() {
        let names = |s: &str| discovery_names(s.parse().unwrap()).iter().map(|a| a.to_string()).collect::<Vec<_>>();
        assert_eq!(names("127.0.0.1:5000"), ["127.0.0.1:5000"]);
        assert_eq!(names("0.0.0.0:5000"), ["0.0.0.0:5000", "127.0.0.1:5000"]);
        assert_eq!(names("[::]:5000"), ["[::]:5000", "[::1]:5000", "127.0.0.1:5000"]);
        assert_eq!(discovery_path(&"[::1]:80".parse().unwrap()), Path::new("/run/sprout/api/[::1]:80"));
    }
}
