//! Who holds the embedded store's lock: fjall takes an exclusive `flock` on `DATA_DIR/lock`,
//! and a second process opening the same directory is refused. Linux lists every lock, with
//! its holder's pid, in `/proc/locks`, so the refusal can say which process to look at.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

/// The file fjall locks in its data directory.
const LOCK_FILE: &str = "lock";

/// Why a data directory cannot be opened: another process uses it, the pid when known.
pub(super) fn in_use_message(data_dir: &Path) -> String {
    let holder = holder_pid(&data_dir.join(LOCK_FILE))
        .map(|pid| format!(" (pid {pid})"))
        .unwrap_or_default();
    format!(
        "another fanline process is using {}{holder}",
        data_dir.display()
    )
}

/// The pid holding a lock on `lock_file`, if `/proc/locks` names one (Linux only).
fn holder_pid(lock_file: &Path) -> Option<u32> {
    let inode = std::fs::metadata(lock_file).ok()?.ino();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    pid_locking_inode(&locks, inode)
}

/// Parses `/proc/locks` lines such as `1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF`:
/// the pid of the first lock on `inode` (its device is not compared: the file's own inode
/// on another device holding a lock at the same moment is too unlikely to matter here).
fn pid_locking_inode(locks: &str, inode: u64) -> Option<u32> {
    locks.lines().find_map(|line| {
        let mut fields = line.split_whitespace().skip(4);
        let pid = fields.next()?.parse::<u32>().ok()?;
        let locked_inode = fields.next()?.rsplit(':').next()?.parse::<u64>().ok()?;
        (locked_inode == inode).then_some(pid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_read_from_proc_locks() {
        let locks = "1: POSIX  ADVISORY  WRITE 17 00:1b:99 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF\n";
        assert_eq!(pid_locking_inode(locks, 1234), Some(4242));
        assert_eq!(pid_locking_inode(locks, 99), Some(17));
        assert_eq!(pid_locking_inode(locks, 5), None);
        assert_eq!(pid_locking_inode("garbage\n", 5), None);
    }

    #[test]
    fn a_lock_this_process_holds_is_found_with_its_pid() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = std::fs::File::create(dir.path().join(LOCK_FILE)).expect("lock file");
        file.try_lock().expect("lock");
        assert_eq!(
            holder_pid(&dir.path().join(LOCK_FILE)),
            Some(std::process::id())
        );
        let message = in_use_message(dir.path());
        assert!(
            message.contains(&format!("(pid {})", std::process::id())),
            "{message}"
        );
    }
}
