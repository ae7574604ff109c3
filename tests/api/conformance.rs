//! The store conformance suite on DynamoDB Local, one test per case (the embedded store runs
//! it as unit tests). The cases share one set of tables, created once; each case connects a
//! client of its own, since a client's connections belong to the runtime of the test that
//! made them, and uses partition keys of its own.

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
