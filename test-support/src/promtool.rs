//! `promtool check metrics` (Debian's `prometheus` package) over a scrape: the exposition
//! parses and passes Prometheus' own lint (counter suffixes, units, help text).

use std::io::Write;
use std::process::{Command, Stdio};

/// Panics with promtool's report unless `text` passes, or when promtool is missing: a
/// machine without it must fail the test, never skip it.
pub fn check_metrics(text: &str) {
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!(
                "promtool is missing: run scripts/test-deps.sh (it installs Debian's prometheus package)"
            )
        }
        Err(e) => panic!("promtool did not start: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && report.trim().is_empty(),
        "promtool check metrics: {}\n{report}\n--- the scrape ---\n{text}",
        output.status
    );
}

/// The value of the sample of metric `name` whose labels are exactly `labels` (in any
/// order); `None` when the scrape has no such series.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    wanted.sort();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, mut found) = match series.split_once('{') {
                Some((metric, rest)) => (
                    metric,
                    rest.strip_suffix('}')?
                        .split("\",")
                        .filter(|pair| !pair.is_empty())
                        .map(|pair| format!("{}\"", pair.trim_end_matches('"')))
                        .collect::<Vec<_>>(),
                ),
                None => (series, Vec::new()),
            };
            found.sort();
            (metric == name && found == wanted).then(|| value.parse().ok())?
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_scrape_passes_and_a_bad_counter_name_fails() {
        check_metrics("# HELP a_total A counter.\n# TYPE a_total counter\na_total 2\n");
        let bad = std::panic::catch_unwind(|| {
            check_metrics("# HELP a A counter.\n# TYPE a counter\na 2\n");
        });
        assert!(bad.is_err(), "a counter without _total is a lint problem");
    }

    #[test]
    fn samples_are_found_by_name_and_label_set() {
        let text =
            "# TYPE x_total counter\nx_total{k=\"a\",j=\"1\"} 3\nx_total{k=\"b\"} 4.5\ny 7\n";
        assert_eq!(sample(text, "x_total", &[("k", "b")]), Some(4.5));
        assert_eq!(
            sample(text, "x_total", &[("j", "1"), ("k", "a")]),
            Some(3.0)
        );
        assert_eq!(
            sample(text, "x_total", &[("k", "a")]),
            None,
            "the whole label set"
        );
        assert_eq!(sample(text, "y", &[]), Some(7.0));
        assert_eq!(sample(text, "x_total", &[("k", "c")]), None);
    }
}
