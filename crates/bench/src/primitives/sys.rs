//! The raw system calls' small change: the last OS error, a path as a C string.

use std::ffi::CString;
use std::io;
use std::path::Path;

use sprout_sandbox::mounts;

pub(super) fn errno() -> io::Error {
    io::Error::last_os_error()
}

pub(super) fn cstr(path: &Path) -> io::Result<CString> {
    mounts::cpath(path)
}
