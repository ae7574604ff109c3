//! The store conformance suite on DynamoDB Local (the embedded run is a unit test).

use fanline::store::{DynamoConfig, DynamoStore, conformance};

use crate::dynamo_local;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_store_passes_the_conformance_suite() {
    let config = DynamoConfig {
        endpoint: Some(dynamo_local::endpoint()),
        table_prefix: format!("conf{}-", uuid::Uuid::new_v4().simple()),
    };
    let store = DynamoStore::connect(&config).await.expect("connect");
    store.create_tables().await.expect("create tables");
    // Creating tables twice is fine.
    store.create_tables().await.expect("create tables again");
    conformance::run_all(&store).await;
}
