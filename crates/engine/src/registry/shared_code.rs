//! Code that lambdas share but for their settings files (ol.yaml's `preload`): its digest, and
//! a copy of it without those files (hard links, under `DIR/registry/.shared/<digest>`), which
//! is the /handler of the code Zygote their sandboxes fork from. A copy lives while any
//! lambda version holds it, and is removed with the last; a restart starts from none.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use sha2::{Digest, Sha256};

use super::lambda_config::Preload;

type Copies = Arc<Mutex<HashMap<String, Weak<SharedCodeDir>>>>;

/// One copy of shared code, held by the lambda versions whose code it is.
#[derive(Debug)]
pub struct SharedCodeDir {
    pub digest: String,
    pub dir: PathBuf,
    /// Bytes of its files.
    pub size_bytes: u64,
    copies: Copies,
}

impl Drop for SharedCodeDir {
    fn drop(&mut self) {
        let mut copies = self.copies.lock().unwrap();
        // A new holder may have made the copy again meanwhile: then it is theirs.
        if copies.get(&self.digest).is_some_and(|w| w.upgrade().is_none()) {
            copies.remove(&self.digest);
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Every copy of shared code, by digest.
pub struct SharedCodes {
    root: PathBuf,
    copies: Copies,
}

impl SharedCodes {
    /// Keep copies under `root`, removing any left from before.
    pub fn open(root: &Path) -> io::Result<SharedCodes> {
        if root.exists() {
            fs::remove_dir_all(root)?;
        }
        fs::create_dir_all(root)?;
        Ok(SharedCodes { root: root.to_path_buf(), copies: Arc::default() })
    }

    /// The shared copy of the code in `code_dir` as `preload` describes it, made if no lambda
    /// holds one yet.
    pub fn share(&self, code_dir: &Path, preload: &Preload) -> io::Result<Arc<SharedCodeDir>> {
        let (digest, size_bytes) = digest_of(code_dir, preload)?;
        let mut copies = self.copies.lock().unwrap();
        if let Some(held) = copies.get(&digest).and_then(Weak::upgrade) {
            return Ok(held);
        }
        let dir = self.root.join(&digest);
        let partial = self.root.join(format!(".{digest}.partial"));
        for old in [&dir, &partial] {
            if old.exists() {
                fs::remove_dir_all(old)?; // its last holder is going: this copy is ours now
            }
        }
        let made = link_tree(code_dir, &partial, Path::new(""), preload).and_then(|()| fs::rename(&partial, &dir));
        if let Err(e) = made {
            let _ = fs::remove_dir_all(&partial);
            return Err(e);
        }
        let shared = Arc::new(SharedCodeDir { digest: digest.clone(), dir, size_bytes, copies: self.copies.clone() });
        copies.insert(digest, Arc::downgrade(&shared));
        Ok(shared)
    }
}

/// Whether `relative` (a path inside the code) is left out of the shared copy: a settings
/// file (or under a settings directory), or compiled bytecode (made from the sources, which
/// are in the digest).
fn left_out(relative: &Path, preload: &Preload) -> bool {
    relative.file_name().is_some_and(|n| n == "__pycache__") || preload.settings.iter().any(|s| relative.starts_with(s))
}

/// The digest of the code in `dir` without what [`left_out`] leaves, and of what to preload
/// from it; and the bytes of its files.
pub fn digest_of(dir: &Path, preload: &Preload) -> io::Result<(String, u64)> {
    let mut hash = Sha256::new();
    hash.update(format!("modules {:?} call {:?}\0", preload.modules, preload.call));
    let mut bytes = 0;
    let mut stack = vec![PathBuf::new()];
    while let Some(relative) = stack.pop() {
        let mut entries: Vec<_> = fs::read_dir(dir.join(&relative))?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries.into_iter().rev() {
            let path = relative.join(entry.file_name());
            if left_out(&path, preload) {
                continue;
            }
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(path);
                continue;
            }
            let contents = if kind.is_symlink() {
                fs::read_link(entry.path())?.into_os_string().into_encoded_bytes()
            } else {
                fs::read(entry.path())?
            };
            bytes += contents.len() as u64;
            hash.update(path.as_os_str().as_encoded_bytes());
            hash.update(format!("\0{}\0", contents.len()));
            hash.update(&contents);
        }
    }
    Ok((hex::encode(hash.finalize()), bytes))
}

/// Copy the tree at `from` to `to` as hard links (symbolic links as themselves), leaving out
/// what [`left_out`] leaves.
fn link_tree(from: &Path, to: &Path, relative: &Path, preload: &Preload) -> io::Result<()> {
    fs::create_dir(to.join(relative))?;
    for entry in fs::read_dir(from.join(relative))? {
        let entry = entry?;
        let path = relative.join(entry.file_name());
        if left_out(&path, preload) && entry.file_name() != "__pycache__" {
            continue;
        }
        let kind = entry.file_type()?;
        if kind.is_dir() {
            link_tree(from, to, &path, preload)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(entry.path())?, to.join(&path))?;
        } else if fs::hard_link(entry.path(), to.join(&path)).is_err() {
            fs::copy(entry.path(), to.join(&path))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preload(settings: &[&str]) -> Preload {
        Preload { modules: vec!["app.web".into()], call: None, settings: settings.iter().map(|s| s.to_string()).collect() }
    }

    fn site(root: &Path, name: &str, secret: &str) -> PathBuf {
        let dir = root.join(name);
        fs::create_dir_all(dir.join("app/__pycache__")).unwrap();
        fs::write(dir.join("f.py"), "from app.web import app\n").unwrap();
        fs::write(dir.join("app/web.py"), "app = None\n").unwrap();
        fs::write(dir.join("app/__pycache__/web.cpython-311.pyc"), name).unwrap();
        fs::write(dir.join("site.toml"), secret).unwrap();
        dir
    }

    #[test]
    fn sites_differing_only_in_settings_share_one_copy_without_them() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (site(tmp.path(), "a", "secret-a"), site(tmp.path(), "b", "secret-b"));
        let codes = SharedCodes::open(&tmp.path().join("shared")).unwrap();
        let settings = preload(&["site.toml"]);
        let (one, two) = (codes.share(&a, &settings).unwrap(), codes.share(&b, &settings).unwrap());
        assert!(Arc::ptr_eq(&one, &two));
        assert!(one.dir.join("app/web.py").exists() && one.dir.join("f.py").exists());
        assert!(one.dir.join("app/__pycache__/web.cpython-311.pyc").exists(), "bytecode is kept, outside the digest");
        assert!(!one.dir.join("site.toml").exists(), "no lambda's settings are in the shared copy");
        // Without naming the settings file, the two differ.
        let whole = preload(&[]);
        assert_ne!(digest_of(&a, &whole).unwrap().0, digest_of(&b, &whole).unwrap().0);
        // What to preload is part of the digest.
        let other = Preload { call: Some("app.web:prepare".into()), ..settings.clone() };
        assert_ne!(digest_of(&a, &settings).unwrap().0, digest_of(&a, &other).unwrap().0);
    }

    #[test]
    fn the_copy_goes_with_its_last_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let a = site(tmp.path(), "a", "x");
        let codes = SharedCodes::open(&tmp.path().join("shared")).unwrap();
        let one = codes.share(&a, &preload(&["site.toml"])).unwrap();
        let two = codes.share(&a, &preload(&["site.toml"])).unwrap();
        let dir = one.dir.clone();
        drop(one);
        assert!(dir.exists(), "still held");
        drop(two);
        assert!(!dir.exists());
        // Made again by the next lambda that needs it.
        assert!(codes.share(&a, &preload(&["site.toml"])).unwrap().dir.exists());
    }
}
