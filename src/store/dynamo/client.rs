//! Connecting: the SDK client, its region, credentials, endpoint, timeouts and (no) retries.

use std::sync::Arc;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::environment::{
    EnvironmentVariableCredentialsProvider, EnvironmentVariableRegionProvider,
};
use aws_config::meta::region::RegionProviderChain;
use aws_config::profile::{ProfileFileCredentialsProvider, ProfileFileRegionProvider};
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{
    Credentials, ProvideCredentials, Region, SharedCredentialsProvider,
};

use super::DynamoStore;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Covers one attempt: connecting, sending and reading the whole response.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `connect` waits for a profile's credentials (a profile may assume a role, which
/// is a request) before an endpoint override falls back to placeholders.
const PROFILE_CREDENTIALS_DEADLINE: Duration = Duration::from_secs(2);
/// The region of an endpoint override when none is configured: local emulators need one but
/// do not care which.
const LOCAL_REGION: &str = "us-east-1";

#[derive(Clone, Debug)]
pub struct DynamoConfig {
    /// Endpoint override (DynamoDB Local, LocalStack); None = `AWS_ENDPOINT_URL_DYNAMODB`,
    /// `AWS_ENDPOINT_URL`, or the SDK's default for the region.
    pub endpoint: Option<String>,
    /// Prepended to every logical table name (default "fanline-").
    pub table_prefix: String,
}

impl Default for DynamoConfig {
    fn default() -> Self {
        DynamoConfig {
            endpoint: None,
            table_prefix: "fanline-".into(),
        }
    }
}

/// Where the credentials of an endpoint override come from, for the one line that says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CredentialSource {
    Environment,
    Profile,
    Placeholder,
}

impl DynamoStore {
    /// Loads region, credentials and endpoint from the standard AWS environment.
    ///
    /// With an endpoint override (from `config`, `AWS_ENDPOINT_URL_DYNAMODB` or
    /// `AWS_ENDPOINT_URL`) the store is probably talking to DynamoDB Local or LocalStack,
    /// which need a region and some credentials but do not care which. Then only the
    /// environment and the profile files are read, never the instance metadata service (a
    /// probe that fails slowly and noisily off EC2): the region defaults to `us-east-1`, the
    /// credentials to placeholders, and one line says which credentials are used. Without
    /// an override, the SDK's default chains apply, as on AWS.
    ///
    /// Timeouts are short so that a dead endpoint fails in seconds, not minutes. The SDK does
    /// not retry: the store does, to count every request it sends.
    pub async fn connect(config: &DynamoConfig) -> anyhow::Result<Self> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(CONNECT_TIMEOUT)
                    .operation_attempt_timeout(ATTEMPT_TIMEOUT)
                    .build(),
            )
            .retry_config(RetryConfig::disabled());
        let endpoint_opt = config.endpoint.clone().or_else(endpoint_from_environment);
        if let Some(endpoint) = &endpoint_opt {
            let region = local_region().await;
            let (credentials, source) = local_credentials().await;
            match source {
                CredentialSource::Placeholder => tracing::debug!(
                    %endpoint,
                    %region,
                    "no aws credentials set: using placeholder credentials for the local endpoint"
                ),
                CredentialSource::Environment => tracing::debug!(
                    %endpoint,
                    %region,
                    "using aws credentials from the environment"
                ),
                CredentialSource::Profile => tracing::debug!(
                    %endpoint,
                    %region,
                    "using aws credentials from the shared profile files"
                ),
            }
            loader = loader
                .endpoint_url(endpoint)
                .region(region)
                .credentials_provider(credentials);
        }
        let sdk_config = loader.load().await;
        if endpoint_opt.is_none() && sdk_config.region().is_none() {
            anyhow::bail!(
                "no aws region configured for dynamodb; set AWS_REGION (or an endpoint override for local use)"
            );
        }

        let endpoint = endpoint_opt.unwrap_or_else(|| {
            let region = sdk_config.region().map(ToString::to_string);
            format!("AWS ({})", region.unwrap_or_default())
        });
        Ok(DynamoStore {
            client: Client::new(&sdk_config),
            table_prefix: config.table_prefix.clone(),
            endpoint,
            stats: Arc::default(),
        })
    }
}

/// The endpoint override the SDK would take from the environment, if any.
fn endpoint_from_environment() -> Option<String> {
    ["AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL"]
        .into_iter()
        .filter_map(|name| std::env::var(name).ok())
        .find(|value| !value.is_empty())
}

/// The region for an endpoint override: `AWS_REGION`, the profile's, else [`LOCAL_REGION`].
async fn local_region() -> Region {
    RegionProviderChain::first_try(EnvironmentVariableRegionProvider::new())
        .or_else(ProfileFileRegionProvider::new())
        .region()
        .await
        .unwrap_or_else(|| Region::from_static(LOCAL_REGION))
}

/// Credentials for an endpoint override: the environment's, else the profile files', else
/// placeholders (DynamoDB Local accepts any). Never the instance metadata service.
async fn local_credentials() -> (SharedCredentialsProvider, CredentialSource) {
    let environment = EnvironmentVariableCredentialsProvider::new();
    if environment.provide_credentials().await.is_ok() {
        return (
            SharedCredentialsProvider::new(environment),
            CredentialSource::Environment,
        );
    }
    let profile = ProfileFileCredentialsProvider::builder().build();
    let probe = tokio::time::timeout(PROFILE_CREDENTIALS_DEADLINE, profile.provide_credentials());
    if let Ok(Ok(_)) = probe.await {
        return (
            SharedCredentialsProvider::new(profile),
            CredentialSource::Profile,
        );
    }
    let placeholder = Credentials::new("fanline", "fanline", None, None, "fanline-placeholder");
    (
        SharedCredentialsProvider::new(placeholder),
        CredentialSource::Placeholder,
    )
}
