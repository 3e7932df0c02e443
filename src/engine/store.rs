//! Object stores: `file://` plus `s3://`, `gs://`, `az://` / `abfs://` and `http(s)://` created on
//! first use from the usual environment variables.
//!
//! | scheme | built with | credentials / settings |
//! |---|---|---|
//! | `s3://bucket` | `AmazonS3Builder::from_env` | `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` (default `us-east-1`), `AWS_ENDPOINT_URL` (S3-compatible servers; `http://` endpoints are allowed) |
//! | `gs://bucket` | `GoogleCloudStorageBuilder::from_env` | `GOOGLE_SERVICE_ACCOUNT`, `GOOGLE_APPLICATION_CREDENTIALS` |
//! | `az://container` | `MicrosoftAzureBuilder::from_env` | `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY`, … |
//! | `http(s)://host` | `HttpBuilder` | – |
//!
//! Transient errors are retried by `object_store`'s default retry policy.

use std::sync::Arc;

use datafusion::common::{exec_datafusion_err, Result as DfResult};
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::{ClientOptions, ObjectStore};
use url::Url;

/// A registry that creates cloud object stores lazily from the environment.
#[derive(Debug, Default)]
pub struct EnvObjectStoreRegistry {
    inner: DefaultObjectStoreRegistry,
}

impl EnvObjectStoreRegistry {
    /// A registry with only the local file system registered.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Build the object store for `url` from the environment (`None` for local paths).
pub fn store_from_env(url: &Url) -> DfResult<Option<Arc<dyn ObjectStore>>> {
    let bucket = url.host_str().unwrap_or_default();
    let store: Arc<dyn ObjectStore> = match url.scheme() {
        "s3" | "s3a" => {
            let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
            if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err()
            {
                b = b.with_region("us-east-1");
            }
            if let Ok(endpoint) =
                std::env::var("AWS_ENDPOINT_URL").or_else(|_| std::env::var("AWS_ENDPOINT"))
            {
                let http = endpoint.starts_with("http://");
                b = b.with_endpoint(endpoint).with_allow_http(http);
                if http {
                    b = b.with_virtual_hosted_style_request(false);
                }
            }
            Arc::new(
                b.build()
                    .map_err(|e| exec_datafusion_err!("s3://{bucket}: {e}"))?,
            )
        }
        "gs" => Arc::new(
            GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket)
                .build()
                .map_err(|e| exec_datafusion_err!("gs://{bucket}: {e}"))?,
        ),
        "az" | "abfs" | "abfss" | "azure" => Arc::new(
            MicrosoftAzureBuilder::from_env()
                .with_url(url.as_str())
                .build()
                .map_err(|e| exec_datafusion_err!("{url}: {e}"))?,
        ),
        "http" | "https" => {
            let base = format!("{}://{}", url.scheme(), url.authority());
            Arc::new(
                HttpBuilder::new()
                    .with_url(base.clone())
                    .with_client_options(ClientOptions::new().with_allow_http(true))
                    .build()
                    .map_err(|e| exec_datafusion_err!("{base}: {e}"))?,
            )
        }
        _ => return Ok(None),
    };
    Ok(Some(store))
}

impl ObjectStoreRegistry for EnvObjectStoreRegistry {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        self.inner.register_store(url, store)
    }

    fn deregister_store(&self, url: &Url) -> DfResult<Arc<dyn ObjectStore>> {
        self.inner.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> DfResult<Arc<dyn ObjectStore>> {
        if let Ok(store) = self.inner.get_store(url) {
            return Ok(store);
        }
        match store_from_env(url)? {
            Some(store) => {
                self.inner.register_store(url, store.clone());
                Ok(store)
            }
            None => self.inner.get_store(url),
        }
    }
}
