//! Temporary directories for daemons, tools and test data.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A temporary directory, removed on drop unless the thread is panicking
/// or `RDMABLK_KEEP_TEMP` is set (then it is kept and its path printed).
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// A new empty directory under the temporary directory, named after
    /// `label`, this process and a counter.
    pub fn new(label: &str) -> TempDir {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("rdmablk-tests-{label}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        TempDir { path }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A sparse file `name` of `bytes` inside it (a file namespace's
    /// backing file); its path.
    pub fn sparse_file(&self, name: &str, bytes: u64) -> PathBuf {
        let path = self.join(name);
        fs::File::create(&path)
            .and_then(|f| f.set_len(bytes))
            .unwrap_or_else(|e| panic!("creating {} of {bytes} bytes: {e}", path.display()));
        path
    }

    /// The path of `name` inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept for inspection: {}", self.path.display());
        } else if std::env::var_os("RDMABLK_KEEP_TEMP").is_some() {
            eprintln!("kept (RDMABLK_KEEP_TEMP): {}", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}
