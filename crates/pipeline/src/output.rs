//! Where results go: a local folder or an object-store prefix, written so that a failed or
//! killed run never leaves a result that looks complete.
//!
//! Layout under the output location:
//!
//! ```text
//! manifest.json                          the run manifest: written last, marks the run complete
//! report.html                            copy of the latest complete run's report
//! runs/<run_id>/report.html              the report of each complete run
//! epifusion.lock                         the lock of the running run (see `lock`)
//! analyses/<id>/manifest.json            the unit's latest complete manifest (resume)
//! analyses/<id>/<run_id>/manifest.json   the same, run-scoped: what run manifests point to
//! analyses/<id>/<run_id>/estimates.parquet
//! analyses/<id>/<run_id>/attrition.parquet
//! analyses/<id>/<run_id>/covariate_ref.parquet
//! analyses/<id>/<run_id>/diagnostics.parquet
//! analyses/<id>/<run_id>/metadata.parquet
//! ```
//!
//! Every object is one PUT (object stores make it visible whole; the local store writes a
//! staging file and renames it). Result objects go under a run-scoped folder, so a new run
//! never overwrites the objects a complete manifest points to; the analysis manifest, written
//! after them, is what makes an analysis complete, and records each object's size and e-tag so
//! that a rerun can check them. The unit's manifest is written twice: run-scoped
//! (`analyses/<id>/<run_id>/manifest.json`, what run manifests point to, never rewritten) and
//! as `analyses/<id>/manifest.json` (the latest complete result, what a rerun resumes from).
//! Objects that the new run manifest does not point to (earlier runs' results, leftovers of
//! failed runs) are deleted only after it is written, so that a run stopped at any point,
//! `--force` included, leaves the visible run manifest and everything it points to intact.
//! `epifusion.lock` at the top is the lock of the running run ([`super::lock`]).

use std::path::PathBuf;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use super::PipelineError;

/// An object written by a run, as recorded in manifests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    /// Path relative to the output location.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// E-tag reported by the store, when it gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e_tag: Option<String>,
}

/// The output location.
#[derive(Debug, Clone)]
pub struct Output {
    /// The location as given (folder or URL).
    pub location: String,
    store: Arc<dyn ObjectStore>,
    prefix: StorePath,
    /// The absolute folder, for local outputs.
    pub local_dir: Option<PathBuf>,
}

fn store_err(location: &str, what: &str, e: impl std::fmt::Display) -> PipelineError {
    PipelineError::Output {
        location: location.to_string(),
        message: format!("{what}: {e}"),
    }
}

impl Output {
    /// Open `location`; a local folder is created unless `read_only` (a dry run).
    pub fn open(location: &str, read_only: bool) -> Result<Self, PipelineError> {
        let local = !location.contains("://") || location.starts_with("file://");
        if local {
            let dir = PathBuf::from(location.trim_start_matches("file://"));
            if read_only && !dir.exists() {
                return Ok(Output {
                    location: location.to_string(),
                    store: Arc::new(object_store::memory::InMemory::new()),
                    prefix: StorePath::default(),
                    local_dir: Some(dir),
                });
            }
            std::fs::create_dir_all(&dir)
                .map_err(|e| store_err(location, "cannot create the folder", e))?;
            let dir = dir
                .canonicalize()
                .map_err(|e| store_err(location, "cannot resolve the folder", e))?;
            let store = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                .map_err(|e| store_err(location, "cannot open the folder", e))?;
            return Ok(Output {
                location: location.to_string(),
                store: Arc::new(store),
                prefix: StorePath::default(),
                local_dir: Some(dir),
            });
        }
        let url = url::Url::parse(location).map_err(|e| store_err(location, "bad URL", e))?;
        let store = epifusion_sql::store::store_from_env(&url)
            .map_err(|e| store_err(location, "cannot open the store", e))?
            .ok_or_else(|| store_err(location, "unsupported URL scheme", url.scheme()))?;
        let prefix =
            StorePath::from_url_path(url.path()).map_err(|e| store_err(location, "bad path", e))?;
        Ok(Output {
            location: location.trim_end_matches('/').to_string(),
            store,
            prefix,
            local_dir: None,
        })
    }

    fn path(&self, rel: &str) -> StorePath {
        rel.split('/')
            .filter(|p| !p.is_empty())
            .fold(self.prefix.clone(), |p, part| p.join(part))
    }

    /// The store path of `rel` (for conditional writes, [`super::lock`]).
    pub(crate) fn object_path(&self, rel: &str) -> StorePath {
        self.path(rel)
    }

    /// The store (for conditional writes, [`super::lock`]).
    pub(crate) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// `rel` as a URL or path a person can open.
    pub fn display(&self, rel: &str) -> String {
        match &self.local_dir {
            Some(d) => d.join(rel).display().to_string(),
            None => format!("{}/{rel}", self.location),
        }
    }

    /// Write `bytes` to `rel` in one PUT.
    pub async fn put(&self, rel: &str, bytes: Vec<u8>) -> Result<ObjectRef, PipelineError> {
        let size = bytes.len() as u64;
        let r = self
            .store
            .put(&self.path(rel), PutPayload::from(bytes))
            .await
            .map_err(|e| store_err(&self.location, &format!("cannot write {rel}"), e))?;
        Ok(ObjectRef {
            path: rel.to_string(),
            size,
            e_tag: r.e_tag,
        })
    }

    /// Read `rel`; None when it does not exist.
    pub async fn get(&self, rel: &str) -> Result<Option<bytes::Bytes>, PipelineError> {
        Ok(self.get_versioned(rel).await?.map(|(b, _)| b))
    }

    /// Read `rel` with its version (e-tag and store version, for conditional updates); None
    /// when it does not exist.
    pub async fn get_versioned(
        &self,
        rel: &str,
    ) -> Result<Option<(bytes::Bytes, UpdateVersion)>, PipelineError> {
        match self.store.get(&self.path(rel)).await {
            Ok(r) => {
                let version = UpdateVersion {
                    e_tag: r.meta.e_tag.clone(),
                    version: r.meta.version.clone(),
                };
                let bytes = r
                    .bytes()
                    .await
                    .map_err(|e| store_err(&self.location, &format!("cannot read {rel}"), e))?;
                Ok(Some((bytes, version)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(store_err(&self.location, &format!("cannot read {rel}"), e)),
        }
    }

    /// Whether `r` is there with the recorded size (and e-tag, when both are known).
    pub async fn verify(&self, r: &ObjectRef) -> Result<bool, PipelineError> {
        match self.store.head(&self.path(&r.path)).await {
            Ok(meta) => Ok(meta.size == r.size
                && match (&meta.e_tag, &r.e_tag) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                }),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(store_err(
                &self.location,
                &format!("cannot check {}", r.path),
                e,
            )),
        }
    }

    /// Paths (relative to the output location) of every object under `rel_prefix`.
    pub async fn list(&self, rel_prefix: &str) -> Result<Vec<String>, PipelineError> {
        let prefix = self.path(rel_prefix);
        let metas: Vec<_> = self
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| store_err(&self.location, &format!("cannot list {rel_prefix}"), e))?;
        let base = self.prefix.as_ref();
        Ok(metas
            .into_iter()
            .map(|m| {
                let p = m.location.as_ref();
                p.strip_prefix(base)
                    .unwrap_or(p)
                    .trim_start_matches('/')
                    .to_string()
            })
            .collect())
    }

    /// Delete `rel` (missing objects are fine).
    pub async fn delete(&self, rel: &str) -> Result<(), PipelineError> {
        match self.store.delete(&self.path(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                // Local folders: drop the folder once empty (object stores have none).
                if let Some(parent) = self
                    .local_dir
                    .as_ref()
                    .and_then(|d| d.join(rel).parent().map(|p| p.to_path_buf()))
                {
                    let _ = std::fs::remove_dir(parent);
                }
                Ok(())
            }
            Err(e) => Err(store_err(
                &self.location,
                &format!("cannot delete {rel}"),
                e,
            )),
        }
    }

    /// Write a JSON document.
    pub async fn put_json(
        &self,
        rel: &str,
        value: &impl Serialize,
    ) -> Result<ObjectRef, PipelineError> {
        let bytes = serde_json::to_vec_pretty(value)
            .map_err(|e| store_err(&self.location, &format!("cannot encode {rel}"), e))?;
        self.put(rel, bytes).await
    }

    /// Read a JSON document; None when missing or not of type `T` (an old or foreign file).
    pub async fn get_json<T: for<'de> Deserialize<'de>>(
        &self,
        rel: &str,
    ) -> Result<Option<T>, PipelineError> {
        Ok(self
            .get(rel)
            .await?
            .and_then(|b| serde_json::from_slice(&b).ok()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_put_verify_list_delete() {
        let dir = std::env::temp_dir().join(format!("epifusion-output-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = Output::open(&dir.display().to_string(), false).unwrap();
        let r = out.put("a/b/x.bin", vec![1, 2, 3]).await.unwrap();
        assert_eq!(r.size, 3);
        assert!(out.verify(&r).await.unwrap());
        let mut wrong = r.clone();
        wrong.size = 4;
        assert!(!out.verify(&wrong).await.unwrap());
        assert_eq!(out.list("a").await.unwrap(), vec!["a/b/x.bin".to_string()]);
        assert_eq!(
            out.get("a/b/x.bin").await.unwrap().unwrap().as_ref(),
            &[1, 2, 3]
        );
        assert_eq!(out.get("nope").await.unwrap(), None);
        out.delete("a/b/x.bin").await.unwrap();
        assert!(!out.verify(&r).await.unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
