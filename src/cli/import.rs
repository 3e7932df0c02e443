//! `epifusion import`: an OMOP CSV dump to typed Parquet.

use super::*;

#[derive(Args, Debug)]
pub(crate) struct ImportArgs {
    /// Folder (or URL) with the OMOP CSV files.
    pub(crate) source: String,
    /// Destination folder or object-store URL for the Parquet files.
    pub(crate) destination: String,
}

pub(crate) fn run_import(a: &ImportArgs) -> Result<()> {
    use epifusion::engine::session::{new_session, SessionOptions};
    let rt = runtime()?;
    rt.block_on(async {
        let ctx = new_session(&SessionOptions::default()).await?;
        let written = epifusion::engine::omop::import(&ctx, &a.source, &a.destination).await?;
        for (table, rows) in &written {
            eprintln!("{table}: {rows} rows");
        }
        eprintln!("imported {} tables into {}", written.len(), a.destination);
        Ok::<(), anyhow::Error>(())
    })
}
