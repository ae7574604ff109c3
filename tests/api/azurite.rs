//! One Azurite for the whole test binary, started through `localstack/azurite.sh`.
//!
//! `FANLINE_TEST_AZURITE_PORT` points the tests at an Azurite Table service already listening
//! on that loopback port; otherwise [`crate::launcher`] starts one that stops with the test
//! binary.

use std::process::Child;
use std::sync::{Mutex, OnceLock};

struct Instance {
    port: u16,
    /// Held for the life of the process; its stdin pipe is the launcher's lifeline.
    _launcher: Option<Mutex<Child>>,
}

static INSTANCE: OnceLock<Instance> = OnceLock::new();

/// The connection string of the shared Azurite; starts it on first use. Panics, with what to
/// install, if it cannot start: Azure tests never skip silently.
pub fn connection_string() -> String {
    fanline::store::development_connection_string(INSTANCE.get_or_init(start).port)
}

fn start() -> Instance {
    if let Ok(port) = std::env::var("FANLINE_TEST_AZURITE_PORT")
        && let Ok(port) = port.parse()
    {
        return Instance {
            port,
            _launcher: None,
        };
    }
    crate::launcher::require(
        &[
            (
                "node",
                "--version",
                "Node.js 20 (apt-get install nodejs npm)",
            ),
            ("npm", "--version", "npm (apt-get install npm)"),
        ],
        "the Azure tests need it to run Azurite; or set FANLINE_TEST_AZURITE_PORT to a \
         running Azurite's table port",
    );
    let (child, port) = crate::launcher::start("azurite.sh", "Azurite");
    Instance {
        port,
        _launcher: Some(Mutex::new(child)),
    }
}
