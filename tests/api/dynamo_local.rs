//! One DynamoDB Local for the whole test binary, started through `localstack/dynamodb-local.sh`.
//!
//! `FANLINE_TEST_DYNAMODB_ENDPOINT` points the tests at an instance that is already running;
//! otherwise [`crate::launcher`] starts one that stops with the test binary.

use std::process::Child;
use std::sync::{Mutex, OnceLock};

struct Instance {
    endpoint: String,
    /// Held for the life of the process; its stdin pipe is the launcher's lifeline.
    _launcher: Option<Mutex<Child>>,
}

static INSTANCE: OnceLock<Instance> = OnceLock::new();

/// The endpoint of the shared DynamoDB Local; starts it on first use. Panics, with what to
/// install, if it cannot start: DynamoDB tests never skip silently.
pub fn endpoint() -> String {
    INSTANCE.get_or_init(start).endpoint.clone()
}

fn start() -> Instance {
    if let Ok(endpoint) = std::env::var("FANLINE_TEST_DYNAMODB_ENDPOINT")
        && !endpoint.is_empty()
    {
        return Instance {
            endpoint,
            _launcher: None,
        };
    }
    require_tools(
        "the DynamoDB tests need it to run DynamoDB Local; or set \
         FANLINE_TEST_DYNAMODB_ENDPOINT to a running instance",
    );

    let (child, port) = crate::launcher::start("dynamodb-local.sh", "DynamoDB Local");
    Instance {
        endpoint: format!("http://127.0.0.1:{port}"),
        _launcher: Some(Mutex::new(child)),
    }
}

/// Fails, saying what to install and `why`, unless Java and npm run (DynamoDB Local needs
/// both): a test that cannot run fails rather than skips.
pub(crate) fn require_tools(why: &str) {
    crate::launcher::require(
        &[
            (
                "java",
                "-version",
                "Java 17 or newer (apt-get install openjdk-17-jre-headless)",
            ),
            (
                "npm",
                "--version",
                "Node.js and npm (apt-get install nodejs npm)",
            ),
        ],
        why,
    );
}
