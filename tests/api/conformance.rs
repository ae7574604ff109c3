//! The store conformance suite on DynamoDB Local, one test per case (the embedded store runs
//! it as unit tests). The cases share one set of tables, created once; each case connects a
//! client of its own, since a client's connections belong to the runtime of the test that
//! made them, and uses partition keys of its own. Also: what connecting to a local endpoint
//! says.

use std::process::Command;

use fanline::store::{DynamoConfig, DynamoStore, Store};
use tokio::sync::OnceCell;

use crate::dynamo_local;

/// The table prefix of the suite's tables, once they exist.
static TABLE_PREFIX: OnceCell<String> = OnceCell::const_new();

async fn connect(table_prefix: String) -> DynamoStore {
    let config = DynamoConfig {
        endpoint: Some(dynamo_local::endpoint()),
        table_prefix,
    };
    DynamoStore::connect(&config).await.expect("connect")
}

/// A store on the suite's tables, creating them on first use.
async fn store() -> ((), DynamoStore) {
    let table_prefix = TABLE_PREFIX
        .get_or_init(|| async {
            let table_prefix = format!("conf{}-", uuid::Uuid::new_v4().simple());
            let store = connect(table_prefix.clone()).await;
            store.create_tables().await.expect("create tables");
            table_prefix
        })
        .await;
    ((), connect(table_prefix.clone()).await)
}

fanline::store_conformance_tests!(store());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_tables_that_exist_already_succeeds() {
    let ((), store) = store().await;
    store.create_tables().await.expect("create tables again");
    store.ping().await.expect("ping");
}

/// Without any AWS setting, a start against a local endpoint never asks the EC2 instance
/// metadata service for credentials (a probe that logged three ~1 KB warnings off EC2), and
/// says in one short line, at debug, that it uses placeholder credentials.
#[test]
fn a_local_endpoint_without_aws_settings_uses_placeholder_credentials_and_says_so_once() {
    // Quiet at the default level; one line at debug.
    for log_level_opt in [None, Some("info,fanline=debug")] {
        let stderr = init_against_dynamodb_local(log_level_opt);
        let lowercase = stderr.to_lowercase();
        for probe in ["imds", "ec2", "instance metadata", "169.254.169.254"] {
            assert!(!lowercase.contains(probe), "{probe:?} in: {stderr}");
        }
        let credential_lines: Vec<&str> = stderr
            .lines()
            .filter(|line| line.contains("credentials"))
            .collect();
        let Some(_) = log_level_opt else {
            assert_eq!(credential_lines, Vec::<&str>::new(), "{stderr}");
            continue;
        };
        assert_eq!(credential_lines.len(), 1, "{stderr}");
        assert!(
            credential_lines[0].contains("using placeholder credentials for the local endpoint"),
            "{stderr}"
        );
        for line in stderr.lines() {
            assert!(line.len() < 300, "a long log line: {line}");
        }
    }
}

/// `fanline init` on DynamoDB Local with no AWS settings at all, logging at `log_level_opt`
/// (the default without); its stderr. The table prefix is random in decimal digits: in hex
/// it could spell a probe such as "ec2", and the tables' names are logged.
fn init_against_dynamodb_local(log_level_opt: Option<&str>) -> String {
    let home = tempfile::tempdir().expect("temp dir");
    let table_prefix = format!("quiet{}-", uuid::Uuid::new_v4().as_u128());
    let mut command = Command::new(env!("CARGO_BIN_EXE_fanline"));
    command
        .arg("init")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("FANLINE_STORE", "dynamodb")
        .env("FANLINE_DYNAMODB_ENDPOINT", dynamo_local::endpoint())
        .env("FANLINE_TABLE_PREFIX", &table_prefix)
        .env("FANLINE_DATA_DIR", home.path().join("data"));
    if let Some(level) = log_level_opt {
        command.env("RUST_LOG", level);
    }
    let output = command.output().expect("run fanline init");
    let stderr = strip_ansi(&String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "fanline init failed: {stderr}");
    stderr
}

/// Removes the terminal colour codes (`ESC [ ... m`) a log line may carry.
fn strip_ansi(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for code in chars.by_ref() {
                if code.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}
