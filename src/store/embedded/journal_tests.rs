//! fjall's journals with fanline's patch (`vendor/fjall/PATCH.md`): each is written with zeros
//! before use, and the next one is prepared while the active one fills. What the store stands
//! on: every write survives a rotation and a reopen, and nothing is left behind.

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// Values of this size, enough of them to fill a journal in a few seconds.
const VALUE_BYTES: usize = 64 * 1_024;
/// A journal's size; the next is prepared once the active one is half full.
const JOURNAL_BYTES: usize = 64 * 1_024 * 1_024;
/// fjall rotates its journal at the first flush past this position.
const ROTATION_BYTES: usize = 64_000_000;

fn key(i: usize) -> String {
    format!("k{i:08}")
}

/// A value of its own for each `i`, so that a value read back under the wrong key shows; and
/// random, so that fjall's journal compression does not shrink it.
fn value(i: usize) -> Vec<u8> {
    let mut state = i as u64;
    let mut value = Vec::with_capacity(VALUE_BYTES);
    while value.len() < VALUE_BYTES {
        // splitmix64
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        value.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    value
}

fn open(dir: &Path) -> (Database, Keyspace) {
    let db = Database::builder(dir)
        .manual_journal_persist(true)
        .open()
        .expect("open the database");
    let keyspace = db
        .keyspace("t", KeyspaceCreateOptions::default)
        .expect("open the keyspace");
    (db, keyspace)
}

fn insert(db: &Database, keyspace: &Keyspace, range: std::ops::Range<usize>) {
    for i in range {
        keyspace.insert(key(i), value(i)).expect("insert");
    }
    db.persist(PersistMode::SyncAll).expect("persist");
}

/// How many values make `bytes` of journal.
fn values_for(bytes: usize) -> usize {
    bytes / VALUE_BYTES + 1
}

/// The journals in `dir`, oldest first.
fn journals(dir: &Path) -> Vec<PathBuf> {
    let mut journals: Vec<(u64, PathBuf)> = files_in(dir)
        .into_iter()
        .filter_map(|path| {
            let id = path
                .file_name()?
                .to_str()?
                .strip_suffix(".jnl")?
                .parse()
                .ok()?;
            Some((id, path))
        })
        .collect();
    journals.sort();
    journals.into_iter().map(|(_, path)| path).collect()
}

/// The next journals being prepared in `dir`.
fn preparations(dir: &Path) -> Vec<PathBuf> {
    files_in(dir)
        .into_iter()
        .filter(|path| path.to_string_lossy().ends_with(".zeroing"))
        .collect()
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .expect("read the database folder")
        .map(|entry| entry.expect("a folder entry").path())
        .collect()
}

/// The one preparation in `dir`: its file is created by the batch that passes the half of the
/// active journal, before that batch returns (the zeros follow on a thread of its own).
fn the_preparation(dir: &Path) -> PathBuf {
    let mut preparations = preparations(dir);
    assert_eq!(preparations.len(), 1, "preparations: {preparations:?}");
    preparations.pop().expect("one preparation")
}

/// Asserts that every block of `path` is on disk: nothing sparse for an append to allocate.
fn assert_written_through(path: &Path) {
    let metadata = std::fs::metadata(path).expect("journal metadata");
    assert!(
        metadata.blocks() * 512 >= metadata.len(),
        "{} is sparse: {} of {} bytes allocated",
        path.display(),
        metadata.blocks() * 512,
        metadata.len()
    );
}

fn assert_all_read_back(keyspace: &Keyspace, count: usize) {
    for i in 0..count {
        let read = keyspace.get(key(i)).expect("get");
        assert!(
            read.as_deref() == Some(value(i).as_slice()),
            "{} read back {:?} bytes, not its value",
            key(i),
            read.map(|value| value.len())
        );
    }
}

#[test]
fn a_new_databases_journal_is_written_with_zeros_not_left_sparse() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_db, _keyspace) = open(dir.path());

    let journals = journals(dir.path());
    assert_eq!(journals.len(), 1, "journals: {journals:?}");
    assert_written_through(&journals[0]);
    let contents = std::fs::read(&journals[0]).expect("read the journal");
    assert_eq!(contents.len(), JOURNAL_BYTES);
    assert!(
        contents.iter().all(|&byte| byte == 0),
        "a new journal holds more than zeros"
    );
}

#[test]
fn writes_across_a_rotation_to_a_prepared_journal_are_all_read_back_after_a_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let past_half = values_for(JOURNAL_BYTES / 2 + VALUE_BYTES);
    let past_rotation = values_for(ROTATION_BYTES + VALUE_BYTES);
    let total = past_rotation + past_half / 4;
    {
        let (db, keyspace) = open(dir.path());
        insert(&db, &keyspace, 0..past_half);
        let preparation = the_preparation(dir.path());
        let prepared_inode = std::fs::metadata(&preparation).expect("metadata").ino();

        insert(&db, &keyspace, past_half..past_rotation);
        // A flush: fjall rotates its journal at a flush.
        keyspace.rotate_memtable_and_wait().expect("flush");

        let active = journals(dir.path()).pop().expect("an active journal");
        assert!(
            !active.ends_with("0.jnl"),
            "the journal was not rotated: {active:?}"
        );
        let active_inode = std::fs::metadata(&active).expect("metadata").ino();
        assert_eq!(
            active_inode, prepared_inode,
            "the rotation did not take the prepared journal"
        );
        assert_written_through(&active);
        assert!(preparations(dir.path()).is_empty());

        // Left in the new journal alone, for the reopen to recover.
        insert(&db, &keyspace, past_rotation..total);
    }

    let (_db, keyspace) = open(dir.path());
    assert_all_read_back(&keyspace, total);
    assert!(
        keyspace.get(key(total)).expect("get").is_none(),
        "a key never written was read back"
    );
}

#[test]
fn a_preparation_not_taken_when_the_database_closes_leaves_nothing_behind() {
    let dir = tempfile::tempdir().expect("temp dir");
    let written = values_for(JOURNAL_BYTES / 2 + VALUE_BYTES);
    {
        let (db, keyspace) = open(dir.path());
        insert(&db, &keyspace, 0..written);
        the_preparation(dir.path());
    }

    assert_eq!(preparations(dir.path()), Vec::<PathBuf>::new());
    let (_db, keyspace) = open(dir.path());
    assert_all_read_back(&keyspace, written);
}

#[test]
fn a_preparation_a_crash_left_behind_is_removed_at_open_and_never_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let (db, keyspace) = open(dir.path());
        insert(&db, &keyspace, 0..3);
    }
    // Not zeros: were it read as a journal, the reopen would fail or show its bytes.
    let leftover = dir.path().join(".tmpCRASHED.zeroing");
    std::fs::write(&leftover, vec![0xA5; 1_024 * 1_024]).expect("write the leftover");

    let (_db, keyspace) = open(dir.path());

    assert!(
        !leftover.exists(),
        "the leftover preparation is still there"
    );
    assert_all_read_back(&keyspace, 3);
}
