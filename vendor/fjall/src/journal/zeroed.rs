// fanline's patch (see PATCH.md at the crate's root): journals written with zeros before use.

//! A journal file whose every block is written before the first entry goes in.
//!
//! A journal created sparse (`set_len`) allocates blocks as entries are appended, so every
//! fsync of a group commit also waits for the file system to commit the allocation (ext4's
//! jbd2). In a file already written with zeros, an append overwrites a block that exists, and
//! an fsync writes the data alone. The zeros are what a sparse file reads as, so recovery reads
//! the same bytes either way.
//!
//! Writing 64 MiB takes a while, so each journal prepares its successor on a thread of its own
//! while it fills; only a database's very first journal is written on the spot. Either way the
//! zeros go into a file of a temporary name, renamed to the journal's once they are synced: a
//! journal's name never stands for a file half written.

use std::{fs::File, io::Write as _, path::Path, thread::JoinHandle};

/// How many zeros one `write` call hands the kernel.
const CHUNK_BYTES: usize = 1_024 * 1_024;

/// What names a journal being prepared; not `jnl`, so recovery passes it over.
const PREPARING_SUFFIX: &str = ".zeroing";

/// Creates `path` (it must not exist) with `len` zeros, synced; the caller syncs the folder.
pub fn create(path: &Path, len: u64) -> std::io::Result<File> {
    let folder = path
        .parent()
        .ok_or_else(|| std::io::Error::other("a journal path without a folder"))?;
    let mut file = temporary(folder)?;
    write_zeros(file.as_file_mut(), len)?;
    take(file, path)
}

/// An empty file in `folder` under a temporary name, removed when dropped.
fn temporary(folder: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .suffix(PREPARING_SUFFIX)
        .tempfile_in(folder)
}

/// Renames `prepared` to `path`, which must not exist.
fn take(prepared: tempfile::NamedTempFile, path: &Path) -> std::io::Result<File> {
    prepared.persist_noclobber(path).map_err(|err| err.error)
}

fn write_zeros(file: &mut File, len: u64) -> std::io::Result<()> {
    let zeros = vec![0; CHUNK_BYTES];
    let mut left = len;
    while left > 0 {
        let chunk = usize::try_from(left).map_or(CHUNK_BYTES, |left| left.min(CHUNK_BYTES));
        file.write_all(&zeros[..chunk])?;
        left -= chunk as u64;
    }
    file.sync_all()?;
    // The writer appends from the start.
    std::io::Seek::rewind(file)
}

/// The next journal, being written with zeros in `folder` on a thread of its own under a
/// unique temporary name, which is removed if it is never taken.
pub struct Preparation {
    /// `None` once taken.
    thread: Option<JoinHandle<std::io::Result<tempfile::NamedTempFile>>>,
}

impl Preparation {
    /// Creates the file before it returns (a cheap step, and one a caller can see), and leaves
    /// the zeros to the thread.
    pub fn start(folder: &Path, len: u64) -> std::io::Result<Self> {
        let mut file = temporary(folder)?;
        let thread = std::thread::Builder::new()
            .name("fjall:journal".to_string())
            .spawn(move || {
                write_zeros(file.as_file_mut(), len)?;
                Ok(file)
            })?;
        Ok(Self {
            thread: Some(thread),
        })
    }

    /// Waits for the preparation and renames its file to `path`, which must not exist; the
    /// caller syncs the folder. An error leaves nothing behind.
    pub fn finish(mut self, path: &Path) -> std::io::Result<File> {
        take(self.wait()?, path)
    }

    fn wait(&mut self) -> std::io::Result<tempfile::NamedTempFile> {
        self.thread
            .take()
            .ok_or_else(|| std::io::Error::other("the journal preparation was taken"))?
            .join()
            .map_err(|_| std::io::Error::other("the journal preparation panicked"))?
    }
}

impl Drop for Preparation {
    /// Waits for the thread, so that nothing writes in the folder once its database is gone;
    /// the file it wrote is removed with it.
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _unused = self.wait();
        }
    }
}

/// Whether `name` is a preparation's file: one a crash left behind, for recovery to remove.
pub fn is_preparation(name: &str) -> bool {
    name.ends_with(PREPARING_SUFFIX)
}
