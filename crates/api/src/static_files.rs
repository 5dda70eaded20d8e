//! Files of one host directory, served on the app port: hyper-staticfile's HTTP side
//! (Content-Type, Content-Length, Last-Modified, 304 on If-Modified-Since, HEAD, ranges) over
//! an opener that cannot leave the directory.
//!
//! tower-http's `ServeDir` follows symbolic links wherever they point, and a directory
//! served here may be a writable volume: a lambda could plant `x -> /etc/shadow` and fetch
//! it through the worker, which runs as root. Checking a path before opening it races with
//! the lambda swapping the link. So every file is opened with `openat2(RESOLVE_BENEATH)`
//! relative to the directory, which the kernel refuses to resolve outside it, by `..`, an
//! absolute link or a link climbing out (Linux 5.6). Only regular files are served (a FIFO
//! would block the opening thread; it is opened non-blocking and refused), and directories
//! never list: a request for one gets its `index.html` or 404. Names starting with a dot
//! (`.secret`, `.git`) are never served.
//!
//! Small files (the usual CSS, scripts, pictures) are answered inline: opened, checked and
//! read on the serving thread from the page cache, as nginx does, because handing each
//! open and read to tokio's blocking pool costs thread wake-ups that, on a busy core, made
//! pages with many assets several times slower. A conditional request the file has not
//! changed since is answered 304 from the open file's status, before any read: browsers
//! revalidate every asset of every page, so most requests here are those. Larger files
//! stream through hyper-staticfile (ranges included).

use std::ffi::CString;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper_staticfile::util::FileResponseBuilder;
use hyper_staticfile::vfs::{FileOpener, FileWithMetadata};
use hyper_staticfile::{AcceptEncoding, ResolveResult, Resolver};

use sprout_engine::ErrorCode;

use crate::http::ApiError;

/// One directory's files.
#[derive(Clone)]
pub struct StaticDir {
    root: Arc<OwnedFd>,
    resolver: Resolver<BeneathOpener>,
}

impl sprout_sites::OpenDir for StaticDir {
    fn open(dir: &Path) -> io::Result<StaticDir> {
        StaticDir::open(dir)
    }
}

impl StaticDir {
    /// Open `dir` (held open for the worker's life) and check that files can be opened
    /// beneath it safely on this kernel.
    pub fn open(dir: &Path) -> io::Result<StaticDir> {
        let file = std::fs::File::open(dir)?;
        if !file.metadata()?.is_dir() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a directory"));
        }
        let root = Arc::new(OwnedFd::from(file));
        match open_beneath(&root, Path::new("")) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                return Err(io::Error::other("serving files safely needs openat2 (Linux 5.6 or later)"))
            }
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        Ok(StaticDir { root: root.clone(), resolver: Resolver::with_opener(BeneathOpener { root }) })
    }

    /// Answer a request for `path` (below the prefix, starting with '/', percent-encoded).
    pub async fn serve(&self, method: &Method, headers: &HeaderMap, path: &str) -> Response {
        if method != Method::GET && method != Method::HEAD {
            let mut response = ApiError::new(ErrorCode::MethodNotAllowed, "static files answer GET and HEAD only").into_response();
            response.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return response;
        }
        let Some(relative) = clean_path(path) else {
            return not_found();
        };
        let since = headers.get(header::IF_MODIFIED_SINCE).and_then(|v| v.to_str().ok()).and_then(|v| httpdate::parse_http_date(v).ok());
        match open_small(&self.root, &relative, since) {
            Small::Answer(file) => return response_for(file, method),
            Small::NotModified(modified) => return not_modified(modified),
            Small::NotFound => return not_found(),
            Small::Large => {}
        }
        let file = match self.resolver.resolve_path(path, AcceptEncoding::none()).await {
            Ok(ResolveResult::Found(file)) => file,
            // Unreadable files and directories (which never list) are as good as absent.
            Ok(_) => return not_found(),
            Err(e) => return ApiError::new(ErrorCode::Internal, format!("reading the file: {e}")).into_response(),
        };
        let content_type = file.content_type.clone();
        let built = FileResponseBuilder::new().request_parts(method, headers).build(file);
        let mut response = match built {
            Ok(r) => r.map(Body::new),
            Err(e) => return ApiError::new(ErrorCode::Internal, e.to_string()).into_response(),
        };
        // hyper-staticfile leaves the type out of its answers to HEAD.
        if let (true, Some(t)) = (method == Method::HEAD && response.status() == StatusCode::OK, content_type) {
            if let Ok(value) = HeaderValue::from_str(&t) {
                response.headers_mut().insert(header::CONTENT_TYPE, value);
            }
        }
        response
    }
}

/// Files up to this size are read whole, inline; larger ones stream.
const INLINE_MAX: u64 = 4 << 20;

/// The request path decoded into a relative path of normal components, or None when it has
/// a component that could climb out or is hidden: `.`, `..`, or any name starting with a
/// dot. "/" and directories map to their index.html.
fn clean_path(path: &str) -> Option<std::path::PathBuf> {
    let decoded = percent_encoding::percent_decode_str(path).decode_utf8().ok()?;
    let mut out = std::path::PathBuf::new();
    for part in decoded.split('/').filter(|p| !p.is_empty()) {
        if part.starts_with('.') || part.contains('\0') {
            return None;
        }
        out.push(part);
    }
    Some(out)
}

/// A small file's answer, before HEAD handling.
struct SmallFile {
    body: Vec<u8>,
    /// Last modified, to the second (as Last-Modified is written).
    modified: Option<SystemTime>,
    content_type: String,
}

enum Small {
    Answer(SmallFile),
    /// Not modified since the request's If-Modified-Since: the file was not read.
    NotModified(SystemTime),
    NotFound,
    Large,
}

/// Open a small file and read it, unless it is not newer than `since` (to the second).
fn open_small(root: &OwnedFd, relative: &Path, since: Option<SystemTime>) -> Small {
    use std::io::Read;
    let mut path = relative.to_path_buf();
    for _ in 0..2 {
        let opened = match open_beneath(root, &path) {
            Ok(f) => f,
            Err(_) => return Small::NotFound,
        };
        if opened.is_dir {
            path = path.join("index.html");
            continue;
        }
        if opened.size > INLINE_MAX {
            return Small::Large;
        }
        let modified = opened.modified.map(to_the_second);
        if let (Some(m), Some(since)) = (modified, since) {
            if m <= since {
                return Small::NotModified(m);
            }
        }
        let mut file = match opened.handle.try_into_std() {
            Ok(f) => f,
            Err(_) => return Small::Large,
        };
        let mut body = Vec::with_capacity(opened.size as usize);
        if file.read_to_end(&mut body).is_err() {
            return Small::NotFound;
        }
        let content_type = mime_guess::from_path(&path).first_or_octet_stream().essence_str().to_string();
        return Small::Answer(SmallFile { body, modified, content_type });
    }
    Small::NotFound
}

fn to_the_second(t: SystemTime) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0))
}

/// 304 with the file's Last-Modified.
fn not_modified(modified: SystemTime) -> Response {
    Response::builder()
        .status(StatusCode::NOT_MODIFIED)
        .header(header::LAST_MODIFIED, httpdate::fmt_http_date(modified))
        .body(Body::empty())
        .unwrap_or_else(|_| not_found())
}

/// 200 with the body (none for HEAD).
fn response_for(file: SmallFile, method: &Method) -> Response {
    let mut builder = Response::builder();
    if let Some(m) = file.modified {
        builder = builder.header(header::LAST_MODIFIED, httpdate::fmt_http_date(m));
    }
    let len = file.body.len();
    let body = if method == Method::HEAD { Body::empty() } else { Body::from(file.body) };
    builder
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, file.content_type)
        .header(header::CONTENT_LENGTH, len)
        .header(header::ACCEPT_RANGES, "none")
        .body(body)
        .unwrap_or_else(|_| not_found())
}

fn not_found() -> Response {
    ApiError::new(ErrorCode::NotFound, "no such file").into_response()
}

/// Opens paths (already cleaned of `..` by hyper-staticfile) beneath one directory.
struct BeneathOpener {
    root: Arc<OwnedFd>,
}

type Opened = io::Result<FileWithMetadata<tokio::fs::File>>;

impl FileOpener for BeneathOpener {
    type File = tokio::fs::File;
    type Future = Pin<Box<dyn Future<Output = Opened> + Send>>;

    fn open(&self, path: &Path) -> Self::Future {
        let (root, path) = (self.root.clone(), path.to_path_buf());
        Box::pin(async move { tokio::task::spawn_blocking(move || open_beneath(&root, &path)).await.map_err(io::Error::other)? })
    }
}

/// Open `path` (relative; empty: the directory itself) beneath `root`, refusing to resolve
/// outside it and anything but regular files and directories.
fn open_beneath(root: &OwnedFd, path: &Path) -> Opened {
    let missing = || io::Error::from(io::ErrorKind::NotFound);
    let bytes = if path.as_os_str().is_empty() { b".".as_slice() } else { path.as_os_str().as_bytes() };
    let name = CString::new(bytes).map_err(|_| missing())?;
    // SAFETY: open_how is plain data; zeroed is its documented initial state.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: valid descriptor, NUL-terminated path, and the size of the struct passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        // EXDEV: the path leads out of the directory; ELOOP: a magic link or a link loop.
        return Err(match e.raw_os_error() {
            Some(libc::EXDEV) | Some(libc::ELOOP) | Some(libc::ENOTDIR) => missing(),
            _ => e,
        });
    }
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    let meta = file.metadata()?;
    if !meta.is_file() && !meta.is_dir() {
        return Err(missing());
    }
    Ok(FileWithMetadata {
        handle: tokio::fs::File::from_std(file),
        size: meta.len(),
        modified: meta.modified().ok(),
        is_dir: meta.is_dir(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_outside_the_directory_opens() {
        let top = tempfile::tempdir().unwrap();
        let served = top.path().join("served");
        std::fs::create_dir_all(served.join("sub")).unwrap();
        std::fs::write(top.path().join("secret"), "no").unwrap();
        std::fs::write(served.join("sub/page.html"), "yes").unwrap();
        std::os::unix::fs::symlink("../secret", served.join("up")).unwrap();
        std::os::unix::fs::symlink(top.path().join("secret"), served.join("absolute")).unwrap();
        std::os::unix::fs::symlink("sub/page.html", served.join("inside")).unwrap();
        let root = OwnedFd::from(std::fs::File::open(&served).unwrap());
        let open = |p: &str| open_beneath(&root, Path::new(p));
        assert!(open("sub/page.html").is_ok() && open("inside").is_ok() && open("").unwrap().is_dir);
        for escape in ["../secret", "up", "absolute", "sub/../../secret", "/etc/hostname", "nothing"] {
            assert_eq!(open(escape).unwrap_err().kind(), io::ErrorKind::NotFound, "{escape}");
        }
        nix::unistd::mkfifo(&served.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(open("fifo").unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_file_not_modified_since_is_answered_without_reading_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("site.css"), "body {}").unwrap();
        let root = OwnedFd::from(std::fs::File::open(dir.path()).unwrap());
        let modified = to_the_second(std::fs::metadata(dir.path().join("site.css")).unwrap().modified().unwrap());
        let at = |since: Option<SystemTime>| open_small(&root, Path::new("site.css"), since);
        let Small::Answer(file) = at(None) else { panic!("no If-Modified-Since: the file") };
        assert_eq!((file.body.as_slice(), file.modified, file.content_type.as_str()), (b"body {}".as_slice(), Some(modified), "text/css"));
        // The same second and later: not modified; the file is not read.
        assert!(matches!(at(Some(modified)), Small::NotModified(m) if m == modified));
        assert!(matches!(at(Some(modified + Duration::from_secs(60))), Small::NotModified(_)));
        // A second older: modified since; the whole file.
        assert!(matches!(at(Some(modified - Duration::from_secs(1))), Small::Answer(f) if f.body == b"body {}"));
        assert!(matches!(open_small(&root, Path::new("gone.css"), Some(modified)), Small::NotFound));
    }
}
