//! Dropping a query stops the `GROUP BY` fit it is running (`cancel_scope`).
//!
//! Its own test binary: the check watches the process-wide counters of group fits started and
//! cancelled (`fit_udaf::FIT_EVENTS`), which other tests' fits would disturb.

use std::sync::atomic::Ordering;
use std::time::Duration;

use epifusion_sql::fit_udaf::FIT_EVENTS;
use epifusion_sql::session::{new_session, SessionOptions};
use futures::StreamExt;

/// Waits until `done()` holds; panics naming `what` after `limit` (a hang guard, not a timing
/// assertion: the events come within seconds).
async fn wait_for(what: &str, limit: Duration, done: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// 2,000 rows of one group: a Cox model whose 100,000 bootstrap replicates would run for many
/// minutes.
const SETUP: &str = "CREATE TABLE d AS SELECT 1 AS g, CAST(value % 97 + 1 AS DOUBLE) AS time, \
    CAST(value % 3 = 0 AS DOUBLE) AS y, \
    CASE WHEN value % 2 = 0 THEN [CAST(5 AS BIGINT)] ELSE [CAST(6 AS BIGINT)] END AS ids \
    FROM generate_series(1, 2000)";
const LONG_FIT: &str = "SELECT g, cox_fit_agg(CAST(NULL AS BIGINT), time, y, ids, \
    '{\"ci\": \"bootstrap\", \"bootstrap\": {\"replicates\": 100000}}') AS fit FROM d GROUP BY g";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_group_by_fit_query_cancels_its_fit() {
    let ctx = new_session(&SessionOptions::default()).await.unwrap();
    ctx.sql(SETUP).await.unwrap().collect().await.unwrap();

    // The plan carries the scope nodes.
    let plan = ctx
        .sql(&format!("EXPLAIN {LONG_FIT}"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&plan)
        .unwrap()
        .to_string();
    assert!(
        text.contains("QueryScopeExec") && text.contains("FitScopeExec"),
        "{text}"
    );

    let started = FIT_EVENTS.started.load(Ordering::SeqCst);
    let cancelled = FIT_EVENTS.cancelled.load(Ordering::SeqCst);
    let mut stream = ctx
        .sql(LONG_FIT)
        .await
        .unwrap()
        .execute_stream()
        .await
        .unwrap();
    // The consumer waits for the first batch: the group's fit is running below it.
    let consumer = tokio::spawn(async move { stream.next().await.map(|r| r.is_ok()) });
    wait_for("the group's fit to start", Duration::from_secs(300), || {
        FIT_EVENTS.started.load(Ordering::SeqCst) > started
    })
    .await;
    assert!(!consumer.is_finished(), "the fit finished before the drop");
    // The client goes away: its stream is dropped while the fit runs.
    consumer.abort();
    assert!(consumer.await.unwrap_err().is_cancelled());
    wait_for("the fit to be cancelled", Duration::from_secs(300), || {
        FIT_EVENTS.cancelled.load(Ordering::SeqCst) > cancelled
    })
    .await;

    // The session still works, and a short fit of the same data is not affected.
    let short = LONG_FIT.replace("100000", "20");
    let rows = ctx.sql(&short).await.unwrap().collect().await.unwrap();
    assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
}
