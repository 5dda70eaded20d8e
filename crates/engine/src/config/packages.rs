//! `[packages]` and `[import_cache]`: where packages come from and are kept (the install
//! cache), and the tree of Zygotes that hold them imported (the import cache).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PackagesSection {
    pub cache_dir: String,
    pub install_cache: bool,
    pub allow_unpinned: bool,
    pub index_url: String,
    pub extra_index_url: String,
    pub wheel_dir: String,
    pub offline: bool,
    pub install_timeout_s: u64,
    pub install_memory_mb: u64,
    pub install_pids: u64,
}

impl Default for PackagesSection {
    fn default() -> Self {
        PackagesSection {
            cache_dir: String::new(),
            install_cache: true,
            allow_unpinned: false,
            index_url: String::new(),
            extra_index_url: String::new(),
            wheel_dir: String::new(),
            offline: false,
            install_timeout_s: 600,
            install_memory_mb: 1024,
            install_pids: 256,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImportCacheSection {
    pub enabled: bool,
    pub memory_mb: u64,
    pub window_s: u64,
    pub max_depth: usize,
    pub learn_imports: bool,
    pub tree: String,
    pub zygote_uid: u32,
    pub zygote_gid: u32,
    pub import_timeout_ms: u64,
}

impl Default for ImportCacheSection {
    fn default() -> Self {
        ImportCacheSection {
            enabled: true,
            memory_mb: 2048,
            window_s: 60,
            max_depth: 6,
            learn_imports: true,
            tree: String::new(),
            zygote_uid: 65533,
            zygote_gid: 65533,
            import_timeout_ms: 60_000,
        }
    }
}

impl PackagesSection {
    /// Where the install cache lives for a worker in `dir`.
    pub fn cache_dir(&self, dir: &Path) -> PathBuf {
        if self.cache_dir.is_empty() {
            dir.join("packages")
        } else {
            PathBuf::from(&self.cache_dir)
        }
    }
}
