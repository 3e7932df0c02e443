//! `epifusion sql`: statements, files or an interactive shell.

use super::*;

#[derive(Args, Debug)]
pub(crate) struct SqlArgs {
    /// SQL to run (several `;`-separated statements allowed).
    #[arg(short = 'c', long = "command")]
    pub(crate) command: Option<String>,
    /// File of SQL statements to run.
    #[arg(short = 'f', long = "file")]
    pub(crate) file: Option<PathBuf>,
    /// OMOP store (folder, file://, s3://, gs://, az://, http(s):// URL) to register.
    #[arg(long)]
    pub(crate) omop: Option<String>,
    /// Output format on stdout: table, csv or json.
    #[arg(long, default_value = "table")]
    pub(crate) format: String,
    /// Write the last statement's result to this file (.parquet, .csv or .json).
    #[arg(long)]
    pub(crate) output: Option<PathBuf>,
    /// DataFusion batch size.
    #[arg(long)]
    pub(crate) batch_size: Option<usize>,
    /// Run the statements on a Ballista cluster (`df://HOST:PORT`, the scheduler of
    /// `epifusion scheduler`): queries and fits run on its executors, DDL in this session;
    /// every table read must name files or URLs that all nodes can read.
    #[arg(long)]
    pub(crate) cluster: Option<String>,
}

pub(crate) fn run_sql_command(a: &SqlArgs) -> Result<()> {
    use epifusion::cluster::cluster_session;
    use epifusion::engine::session::{new_session, SessionOptions};
    use epifusion::engine::shell::{self, OutputFormat};
    let format = OutputFormat::parse(&a.format)?;
    let sql = match (&a.command, &a.file) {
        (Some(_), Some(_)) => bail!("give either -c or -f, not both"),
        (Some(c), None) => Some(c.clone()),
        (None, Some(f)) => Some(
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?,
        ),
        (None, None) => None,
    };
    let rt = runtime()?;
    rt.block_on(async {
        let opts = SessionOptions {
            omop: a.omop.clone(),
            batch_size: a.batch_size,
        };
        let ctx = match &a.cluster {
            Some(cluster) => cluster_session(cluster, &opts).await?,
            None => new_session(&opts).await?,
        };
        match sql {
            Some(sql) => {
                let mut stdout = std::io::stdout();
                shell::run_sql(&ctx, &sql, format, a.output.as_deref(), &mut stdout).await?;
            }
            None => shell::interactive(std::sync::Arc::new(ctx), format).await?,
        }
        Ok::<(), anyhow::Error>(())
    })
}
