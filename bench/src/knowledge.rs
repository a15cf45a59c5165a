//! Knowledge (`BENCH_ONLY=knowledge`, B3, B4): ingest and lexical search through the API.
//! Hybrid search (embeddings) is not built, so only the lexical ranking is measured.
//!
//! - **Ingest**: 200 generated Markdown documents (a title and five paragraphs, about five
//!   passages each) uploaded one after another to a new base, timed from the first upload
//!   to every document `ready`: documents and MB per second. Then the large base's filler
//!   (documents of about 100 passages each) the same way, as a second row.
//! - **Search**: 200 queries of 2 to 4 vocabulary words, one at a time, `POST
//!   /v1/knowledge/{id}/search` with `limit` 5, over the small base (about 1,000 passages)
//!   and over the large one (the same 200 documents and the filler, `BENCH_KNOWLEDGE_CHUNKS`
//!   passages in all, default 100,000): p50 and p99.
//! - **Recall@5**: 50 of the 200 documents each hold one labelled paragraph with a pair of
//!   rare words no other paragraph holds together (each rare word alone is also strewn
//!   through other paragraphs); its query is the pair and two ordinary words of the
//!   paragraph. Recall@5 is the share of queries whose labelled document is among the top
//!   5 passages' documents, on each base; beside it, the same with the rare pair alone.
//!
//! Every byte comes from a fixed seeded generator, so every run indexes the same text.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::system::{Row, System, ms, pct, row, sorted};

/// Documents of the small base.
const DOCUMENTS: usize = 200;
/// Paragraphs of a small document; one paragraph is about one passage.
const PARAGRAPHS: usize = 5;
/// Paragraphs of a filler document of the large base.
const FILLER_PARAGRAPHS: usize = 100;
/// Labelled paragraphs (one per [`LABEL_EVERY`]th small document).
const LABELS: usize = 50;
const LABEL_EVERY: usize = DOCUMENTS / LABELS;
/// Rare words the labels' pairs are made of.
const RARE: usize = 20;
/// Ordinary vocabulary.
const VOCABULARY: usize = 2_000;
/// Timed queries per base, after [`WARM`] untimed ones.
const QUERIES: usize = 200;
const WARM: usize = 10;
/// How long one base's documents may take to be ready.
const INGEST_LIMIT: Duration = Duration::from_secs(3_600);

/// xorshift64*: the same stream on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A vocabulary index, log-uniform: a few words are everywhere, most are rare, as in
    /// prose.
    fn word(&mut self) -> usize {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((VOCABULARY as f64).powf(u) as usize).saturating_sub(1)
    }
}

/// Made-up words of consonant-vowel syllables (no `x` or `z`: the rare words start with
/// those), so no stop word or English stem collides with them.
fn vocabulary() -> Vec<String> {
    const CONSONANTS: &[u8] = b"bdfgklmnprstv";
    const VOWELS: &[u8] = b"aeiou";
    let mut rng = Rng(0x5eed_0001);
    let mut words = std::collections::BTreeSet::new();
    let mut out = Vec::with_capacity(VOCABULARY);
    while out.len() < VOCABULARY {
        let syllables = 2 + rng.below(3);
        let mut w = String::new();
        for _ in 0..syllables {
            w.push(CONSONANTS[rng.below(CONSONANTS.len())] as char);
            w.push(VOWELS[rng.below(VOWELS.len())] as char);
        }
        if words.insert(w.clone()) {
            out.push(w);
        }
    }
    out
}

fn rare_words() -> Vec<String> {
    (0..RARE)
        .map(|i| {
            format!(
                "zyx{}{}",
                (b'a' + (i / 5) as u8) as char,
                ["ba", "di", "fu", "ko", "le"][i % 5]
            )
        })
        .collect()
}

/// Label `i`'s pair of rare words: unique to it for `i < 60`.
fn label_pair(i: usize) -> (usize, usize) {
    let a = i % RARE;
    (a, (a + 1 + i / RARE) % RARE)
}

struct Corpus {
    words: Vec<String>,
    rare: Vec<String>,
    rng: Rng,
}

impl Corpus {
    fn new(seed: u64) -> Self {
        Self {
            words: vocabulary(),
            rare: rare_words(),
            rng: Rng(seed),
        }
    }

    /// A paragraph of about 900 bytes (with the 200 bytes a passage repeats from the one
    /// before, one passage of the chunker's 1200); one in ten carries a rare word alone.
    fn paragraph(&mut self, out: &mut String) {
        let start = out.len();
        let rare_at = (self.rng.below(10) == 0).then(|| 20 + self.rng.below(80));
        let mut n = 0;
        while out.len() - start < 900 {
            let len = 8 + self.rng.below(8);
            for k in 0..len {
                let w = if rare_at == Some(n) {
                    &self.rare[self.rng.below(RARE)]
                } else {
                    &self.words[self.rng.word()]
                };
                if k == 0 {
                    let mut c = w.chars();
                    out.extend(c.next().map(|c| c.to_ascii_uppercase()));
                    out.push_str(c.as_str());
                } else {
                    out.push(' ');
                    out.push_str(w);
                }
                n += 1;
            }
            out.push_str(". ");
        }
        out.push_str("\n\n");
    }

    fn heading(&mut self, level: &str, out: &mut String) {
        out.push_str(level);
        for _ in 0..2 + self.rng.below(3) {
            out.push(' ');
            out.push_str(&self.words[self.rng.word()]);
        }
        out.push_str("\n\n");
    }

    /// A Markdown document of `paragraphs` paragraphs, two to four to a section.
    fn document(&mut self, paragraphs: usize) -> String {
        let mut out = String::new();
        self.heading("#", &mut out);
        let mut left = paragraphs;
        while left > 0 {
            self.heading("##", &mut out);
            for _ in 0..left.min(2 + self.rng.below(3)) {
                self.paragraph(&mut out);
                left -= 1;
            }
        }
        out
    }

    /// Label `i`'s paragraph and its query (the rare pair and two of its ordinary words).
    fn labelled(&mut self, i: usize) -> (String, String) {
        let (a, b) = label_pair(i);
        let (a, b) = (self.rare[a].clone(), self.rare[b].clone());
        let ordinary: Vec<String> = (0..40)
            .map(|_| self.words[self.rng.word()].clone())
            .collect();
        let text = format!(
            "{} {} {a} {} {} {b} {}.\n\n",
            ordinary[..12].join(" "),
            ordinary[12],
            ordinary[13],
            ordinary[14..28].join(" "),
            ordinary[28..].join(" ")
        );
        let query = format!("{a} {b} {} {}", ordinary[13], ordinary[20]);
        let mut first = text;
        first[..1].make_ascii_uppercase();
        (first, query)
    }

    /// A query of 2 to 4 vocabulary words.
    fn query(&mut self) -> String {
        let n = 2 + self.rng.below(3);
        let words: Vec<&str> = (0..n)
            .map(|_| self.words[self.rng.word()].as_str())
            .collect();
        words.join(" ")
    }
}

/// The small base's documents and the labels' (document index, query).
fn small_documents() -> (Vec<String>, Vec<(usize, String)>) {
    let mut corpus = Corpus::new(0x5eed_0002);
    let mut labels = Vec::with_capacity(LABELS);
    let documents = (0..DOCUMENTS)
        .map(|d| {
            let mut doc = corpus.document(PARAGRAPHS);
            if d % LABEL_EVERY == 0 {
                let (paragraph, query) = corpus.labelled(d / LABEL_EVERY);
                // After the first section's heading, so it is a paragraph of its own.
                let at = doc.find("\n\n## ").map_or(doc.len(), |i| i + 2);
                let at = doc[at..].find("\n\n").map_or(doc.len(), |i| at + i + 2);
                doc.insert_str(at, &paragraph);
                labels.push((d, query));
            }
            doc
        })
        .collect();
    (documents, labels)
}

async fn create_base(system: &System, name: &str) -> Result<String> {
    let response = system
        .post_json("/v1/knowledge", &json!({"name": name}))
        .await?;
    if response.status() != 201 {
        bail!(
            "create base: {} {}",
            response.status(),
            response.text().await?
        );
    }
    let base: Value = response.json().await?;
    Ok(base["id"].as_str().context("base id")?.to_owned())
}

/// `POST /v1/knowledge/{base}/documents` with `text` as `name`: the document's id.
async fn upload(system: &System, base: &str, name: &str, text: &str) -> Result<String> {
    let response = system
        .post_file(
            &format!("/v1/knowledge/{base}/documents"),
            name,
            "text/markdown",
            text.as_bytes(),
        )
        .await?;
    if response.status() != 202 {
        bail!("upload: {} {}", response.status(), response.text().await?);
    }
    let document: Value = response.json().await?;
    Ok(document["id"].as_str().context("document id")?.to_owned())
}

async fn get(system: &System, path: &str) -> Result<Value> {
    let response = system
        .http
        .get(format!("{}{path}", system.url))
        .bearer_auth(&system.key)
        .send()
        .await?;
    if response.status() != 200 {
        bail!(
            "GET {path}: {} {}",
            response.status(),
            response.text().await?
        );
    }
    Ok(response.json().await?)
}

/// What one ingest took.
struct Ingest {
    documents: usize,
    bytes: usize,
    took: Duration,
    /// The base's passages once all are ready.
    chunks: i64,
    /// The documents' ids, in upload order.
    ids: Vec<String>,
}

impl Ingest {
    fn row(&self, what: &str) -> Row {
        let secs = self.took.as_secs_f64();
        row(
            "knowledge",
            &format!("ingest, {what}"),
            String::new(),
            String::new(),
            format!(
                "{:.1} docs/s, {:.2} MB/s ({} documents, {:.1} MB, {} passages in {:.1} s)",
                self.documents as f64 / secs,
                self.bytes as f64 / 1e6 / secs,
                self.documents,
                self.bytes as f64 / 1e6,
                self.chunks,
                secs
            ),
        )
    }
}

/// Uploads `documents` to `base` one after another and waits for all of them (and those
/// the base already holds) to be `ready`, polling the base's counts.
async fn ingest<I>(system: &System, base: &str, documents: I) -> Result<Ingest>
where
    I: IntoIterator<Item = String>,
{
    let before = get(system, &format!("/v1/knowledge/{base}")).await?;
    let before = before["documents"].as_i64().context("documents")?;
    let started = Instant::now();
    let (mut ids, mut bytes) = (Vec::new(), 0);
    for text in documents {
        ids.push(upload(system, base, &format!("doc-{}.md", ids.len()), &text).await?);
        bytes += text.len();
    }
    let count = ids.len();
    let want = before + count as i64;
    loop {
        let now = get(system, &format!("/v1/knowledge/{base}")).await?;
        if now["documents_ready"].as_i64() == Some(want) {
            return Ok(Ingest {
                documents: count,
                bytes,
                took: started.elapsed(),
                chunks: now["chunks"].as_i64().context("chunks")?,
                ids,
            });
        }
        if started.elapsed() > INGEST_LIMIT {
            let last = ids.last().context("no document")?;
            let doc = get(system, &format!("/v1/knowledge/{base}/documents/{last}")).await?;
            bail!("ingest: {now} after {INGEST_LIMIT:?}; the last document: {doc}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `POST /v1/knowledge/{base}/search`: the latency and the passages' document ids, or
/// `None` when the search outran the database's statement timeout (`503`): a query of
/// common words over a large base can, and the figure says how often.
async fn search(
    system: &System,
    base: &str,
    query: &str,
) -> Result<(Duration, Option<Vec<String>>)> {
    let started = Instant::now();
    let response = system
        .post_json(
            &format!("/v1/knowledge/{base}/search"),
            &json!({"query": query, "limit": 5}),
        )
        .await?;
    if response.status() == 503 {
        return Ok((started.elapsed(), None));
    }
    if response.status() != 200 {
        bail!("search: {} {}", response.status(), response.text().await?);
    }
    let found: Value = response.json().await?;
    let took = started.elapsed();
    let documents = found["passages"]
        .as_array()
        .context("passages")?
        .iter()
        .filter_map(|p| p["document_id"].as_str().map(str::to_owned))
        .collect();
    Ok((took, Some(documents)))
}

/// The search rows of `base` (`chunks` passages); `ids[d]` is small document `d`'s id in it.
async fn search_rows(
    system: &System,
    base: &str,
    chunks: i64,
    ids: &[String],
    labels: &[(usize, String)],
    rows: &mut Vec<Row>,
) -> Result<()> {
    let mut corpus = Corpus::new(0x5eed_0003);
    let mut timings = Vec::with_capacity(QUERIES);
    let (mut found, mut unavailable) = (0usize, 0usize);
    for i in 0..WARM + QUERIES {
        let (took, documents) = search(system, base, &corpus.query()).await?;
        match documents {
            Some(documents) => found += documents.len(),
            None => unavailable += 1,
        }
        if i >= WARM {
            timings.push(took);
        }
    }
    let timings = sorted(timings);
    let n = labels.len();
    // The rare pair alone, then with the two ordinary words (the query as labelled).
    let (mut pair_hits, mut hits) = (0, 0);
    for (d, query) in labels {
        let pair: Vec<&str> = query.split(' ').take(2).collect();
        let hit = |documents: Option<Vec<String>>| {
            usize::from(documents.is_some_and(|found| found.contains(&ids[*d])))
        };
        pair_hits += hit(search(system, base, &pair.join(" ")).await?.1);
        hits += hit(search(system, base, query).await?.1);
    }
    rows.push(row(
        "knowledge",
        &format!("lexical search, {chunks} passages"),
        ms(pct(&timings, 50.0)),
        ms(pct(&timings, 99.0)),
        format!(
            "recall@5 {hits}/{n} (the rare pair alone {pair_hits}/{n}); {QUERIES} queries \
             of 2-4 words, {:.1} passages each, {unavailable} answered 503",
            found as f64 / (WARM + QUERIES) as f64
        ),
    ));
    Ok(())
}

/// `BENCH_KNOWLEDGE_CHUNKS`: the large base's passages (default 100,000).
fn large_chunks() -> Result<usize> {
    match std::env::var("BENCH_KNOWLEDGE_CHUNKS") {
        Ok(v) => v
            .parse()
            .with_context(|| format!("BENCH_KNOWLEDGE_CHUNKS={v}: not a number")),
        Err(_) => Ok(100_000),
    }
}

pub async fn knowledge(rows: &mut Vec<Row>) -> Result<()> {
    let target = large_chunks()?;
    let system = System::start(None).await?;
    let (documents, labels) = small_documents();

    let small = create_base(&system, "small").await?;
    let ingested = ingest(&system, &small, documents.iter().cloned()).await?;
    rows.push(ingested.row(&format!(
        "{DOCUMENTS} Markdown documents of ~{PARAGRAPHS} passages"
    )));
    search_rows(
        &system,
        &small,
        ingested.chunks,
        &ingested.ids,
        &labels,
        rows,
    )
    .await?;
    eprintln!("bench: knowledge small base done");

    // The large base: the same 200 documents (their labels), then filler to the target.
    let large = create_base(&system, "large").await?;
    let first = ingest(&system, &large, documents).await?;
    let short = usize::try_from(target as i64 - first.chunks).unwrap_or(0);
    let fillers = short.div_ceil(FILLER_PARAGRAPHS);
    let mut corpus = Corpus::new(0x5eed_0004);
    let filled = ingest(
        &system,
        &large,
        (0..fillers).map(|_| corpus.document(FILLER_PARAGRAPHS)),
    )
    .await?;
    rows.push(filled.row(&format!(
        "{fillers} Markdown documents of ~{FILLER_PARAGRAPHS} passages"
    )));
    search_rows(&system, &large, filled.chunks, &first.ids, &labels, rows).await?;
    eprintln!("bench: knowledge done");
    system.close().await;
    Ok(())
}
