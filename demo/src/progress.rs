//! What the demo says while it starts things and waits for them.

use std::io::Write as _;
use std::time::{Duration, Instant};

/// Runs `work`, saying what it is and how long it took.
pub async fn step<T, E>(what: &str, work: impl Future<Output = Result<T, E>>) -> Result<T, E> {
    print!("  {what} ... ");
    let _ = std::io::stdout().flush();
    let started = Instant::now();
    let result = work.await;
    match &result {
        Ok(_) => println!("{:.1}s", started.elapsed().as_secs_f64()),
        Err(_) => println!("failed"),
    }
    result
}

/// Polls `check` every 200 ms until it answers, for at most `timeout`.
pub async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    check: impl AsyncFn() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    step(what, async {
        let started = Instant::now();
        loop {
            if let Some(value) = check().await? {
                return Ok(value);
            }
            anyhow::ensure!(
                started.elapsed() < timeout,
                "gave up waiting for {what} after {}s",
                timeout.as_secs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
}
