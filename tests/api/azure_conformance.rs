//! The store conformance suite on Azurite, one test per case, and the cases of Azure's own
//! limits: the atomic scope, escaped keys, values split across properties, continuation
//! pages. The cases share one set of tables, created once; each case connects a store of its
//! own and uses partition keys of its own.

use fanline::store::{AzureConfig, AzureStore, Store};
use tokio::sync::OnceCell;

use crate::azurite;

/// The table prefix of the suite's tables, once they exist.
static TABLE_PREFIX: OnceCell<String> = OnceCell::const_new();

fn connect(table_prefix: String) -> AzureStore {
    AzureStore::connect(&AzureConfig {
        connection_string: azurite::connection_string(),
        table_prefix,
    })
    .expect("connect")
}

/// A store on the suite's tables, creating them on first use.
async fn store() -> ((), AzureStore) {
    let table_prefix = TABLE_PREFIX
        .get_or_init(|| async {
            let table_prefix = format!("conf{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
            let store = connect(table_prefix.clone());
            store.create_tables().await.expect("create tables");
            table_prefix
        })
        .await;
    ((), connect(table_prefix.clone()))
}

fanline::store_conformance_tests!(store());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_tables_that_exist_already_succeeds() {
    let ((), store) = store().await;
    store.create_tables().await.expect("create tables again");
    store.ping().await.expect("ping");
}
