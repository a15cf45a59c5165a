//! A chat's files in its worker's workspace (T25): every file attached to the chat is
//! under `uploads/` before a worker tool call runs.
//!
//! - The turn's replica reads the chat's files once per turn, at its first worker call
//!   ([`Sessions::manifest`], one bounded query; a turn that calls no worker tool reads
//!   nothing), and names them (`files::workspace`).
//! - The replica holding the worker's channel (this one, or the owner a relayed call goes
//!   to, the manifest riding along) sends the files its channel has not confirmed in
//!   `agent_runtime/uploads` ([`deliver`]); the worker downloads each one it lacks with its
//!   session token (`GET /v1/worker/files/{id}`, so the bytes never cross the channel or
//!   the relay) and answers what it placed and what failed. Confirmed files are kept on the
//!   channel's `LiveWorker`: the next call costs nothing, and a re-dial or a new worker
//!   (after a snapshot restore, say) asks again.
//! - A file that is not placed is never dropped silently: the call still runs, and its
//!   result opens with a note naming each missing file and why.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use protocol::uploads::{MAX_UPLOADS, UPLOADS_CAPABILITY, UPLOADS_REQUEST, UploadsRequest};
use protocol::{ChatId, TeamId, TurnId};
use uuid::Uuid;

use super::Sessions;
use super::placing::{Delivery, place, unconfirmed};
use super::registry::LiveWorker;
use crate::files::workspace::{self, Manifest, path};
use crate::tools::ToolOutput;

/// How long a turn's manifest is kept for its later calls; a longer turn reads it again.
const KEPT_FOR: Duration = Duration::from_secs(600);

/// What the model reads when the chat's files could not be listed.
const NOT_LISTED: &str = "The files attached to this chat could not be listed just now: \
    some may be missing from uploads/ in your workspace; a later tool call tries again.";

/// The manifest of each turn that ran a worker call on this replica lately.
#[derive(Default)]
pub(super) struct Manifests(Mutex<HashMap<TurnId, (Arc<Manifest>, Instant)>>);

/// A turn's files as its calls deliver them: the manifest, or why it is unknown.
pub(super) type TurnFiles = Result<Arc<Manifest>, &'static str>;

impl Sessions {
    /// The chat's files as its worker places them, read once per turn and shared with the
    /// turn's worker calls: what the model is told of their paths. `None` when they could
    /// not be read (a worker call then says so).
    pub async fn chat_files(
        &self,
        team: TeamId,
        chat: ChatId,
        turn: TurnId,
    ) -> Option<Arc<Manifest>> {
        self.manifest(team, chat, turn).await.ok()
    }

    /// The files of `chat`, read at `turn`'s first worker call and kept for its others;
    /// a failed read is not kept, so the next call reads again.
    pub(super) async fn manifest(&self, team: TeamId, chat: ChatId, turn: TurnId) -> TurnFiles {
        let kept = self
            .manifests
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&turn)
            .map(|(manifest, _)| manifest.clone());
        if let Some(manifest) = kept {
            return Ok(manifest);
        }
        let manifest = match workspace::manifest(&self.store, team, chat).await {
            Ok(manifest) => Arc::new(manifest),
            Err(err) => {
                tracing::warn!(%chat, class = err.metric_label(), "chat files not listed for the workspace");
                return Err(NOT_LISTED);
            }
        };
        let mut kept = self
            .manifests
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        kept.retain(|_, (_, since)| since.elapsed() < KEPT_FOR);
        kept.insert(turn, (manifest.clone(), Instant::now()));
        Ok(manifest)
    }
}

/// Places on `worker` the files of `files` its channel has not confirmed yet; what the
/// model is to read about those that are not in the workspace (`None`: all are).
pub(super) async fn deliver(worker: &LiveWorker, files: &TurnFiles) -> Option<String> {
    let manifest = match files {
        Ok(manifest) => manifest,
        Err(note) => return Some((*note).to_owned()),
    };
    // B8: the agent's skills go with the files, their note (if any) first.
    let skills_note = super::skills::deliver(worker, &manifest.skills).await;
    let files_note = deliver_files(worker, manifest).await;
    match (skills_note, files_note) {
        (Some(skills), Some(files)) => Some(format!("{skills}\n{files}")),
        (skills, files) => skills.or(files),
    }
}

/// The files part of [`deliver`].
async fn deliver_files(worker: &LiveWorker, manifest: &Manifest) -> Option<String> {
    let left_out = manifest.left_out.then(|| {
        format!(
            "Files attached to this chat after its first {MAX_UPLOADS} are not in your workspace."
        )
    });
    let missing = unconfirmed(worker, &manifest.files, |file| file.id);
    if missing.is_empty() {
        return left_out;
    }
    let started = Instant::now();
    let request = UploadsRequest {
        files: missing.clone(),
    };
    let named: Vec<(Uuid, String)> = missing.iter().map(|f| (f.id, path(&f.name))).collect();
    let failures = place(worker, &FILES, serde_json::to_value(request), &named).await;
    tracing::info!(
        session = ?worker.binding().map(|b| b.session),
        asked = missing.len(),
        failed = failures.len(),
        ms = started.elapsed().as_millis() as u64,
        "chat files delivered to the workspace"
    );
    let mut notes: Vec<String> = left_out.into_iter().collect();
    if !failures.is_empty() {
        let listed: Vec<String> = failures
            .iter()
            .map(|(path, why)| format!("{path} ({why})"))
            .collect();
        notes.push(format!(
            "These files attached to this chat are not in your workspace: {}.",
            listed.join(", ")
        ));
    }
    (!notes.is_empty()).then(|| notes.join("\n"))
}

const FILES: Delivery = Delivery {
    capability: UPLOADS_CAPABILITY,
    method: UPLOADS_REQUEST,
    older: "this worker cannot take files: it is of an older release",
};

/// `output` with `note` (about the chat's files) before it.
pub(super) fn noted(mut output: ToolOutput, note: Option<String>) -> ToolOutput {
    if let Some(note) = note {
        output.content = if output.content.is_empty() {
            note
        } else {
            format!("{note}\n\n{}", output.content)
        };
    }
    output
}
