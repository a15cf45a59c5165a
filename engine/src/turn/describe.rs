//! Images for a model without vision (T27): each image of the history window is
//! described once by the `vision` auxiliary route, and the description takes the image's
//! place (`Attachment::instead`) as a PDF's text does, so a fallback that has vision
//! still gets the image itself.
//!
//! The description is kept on the file's row: a later turn reads it and asks nothing. A
//! turn claims a file before asking (a conditional update, so two turns at once do not
//! both pay); a claim older than [`DESCRIBE_BOUND`] may be taken again, and after
//! [`MAX_ATTEMPTS`] the file is no longer asked about. Each call is bounded in time and
//! billed as a usage event of the turn, like a title. Neither the image nor its
//! description is ever logged.

use std::time::Duration;

use protocol::{AgentId, TeamId, TurnId};
use providers::Attachment;
use store::{ChatFileRow, DescriptionClaim};
use tokio::sync::OnceCell;

use super::attachments::Describe;
use super::auxiliary::{OneShot, chosen, one_shot};
use crate::Engine;
use crate::models::catalog::team_catalog;

/// How long the describing of one image may take; a claim older than this may be taken
/// again by another turn.
const DESCRIBE_BOUND: Duration = Duration::from_secs(30);
/// How often an image is asked about before it is given up on.
const MAX_ATTEMPTS: i16 = 3;
/// A description is a paragraph: a small output cap bounds its cost.
const DESCRIBE_MAX_OUTPUT_TOKENS: u32 = 400;
/// The longest description kept (the column holds up to 16 KiB).
const MAX_DESCRIPTION_CHARS: usize = 4000;

const DESCRIBE_INSTRUCTIONS: &str = "Describe this image for someone who cannot see it: \
    what it shows, any text in it word for word, and for a chart or table its figures. \
    Be factual and concise; answer with the description only.";

/// What the turn's model is given for its images.
enum Plan {
    /// The model has vision: the images as they are.
    Sees,
    /// No vision route names a model with vision: a note saying so.
    NoRoute,
    /// The route that describes them.
    Describe(String),
}

/// Describes the images of one turn's history window, deciding once (on the first
/// image) whether the turn needs it.
pub(super) struct Describer<'a> {
    state: &'a Engine,
    team: TeamId,
    agent: AgentId,
    turn: TurnId,
    user: Option<&'a str>,
    /// The turn's own route: the model whose vision decides.
    model: Option<&'a str>,
    /// The agent's `vision` route; `None` takes the team's.
    own: Option<&'a str>,
    plan: OnceCell<Plan>,
}

impl<'a> Describer<'a> {
    pub(super) fn new(
        state: &'a Engine,
        ids: (TeamId, AgentId, TurnId),
        user: Option<&'a str>,
        model: Option<&'a str>,
        own: Option<&'a str>,
    ) -> Self {
        let (team, agent, turn) = ids;
        Self {
            state,
            team,
            agent,
            turn,
            user,
            model,
            own,
            plan: OnceCell::new(),
        }
    }

    async fn plan(&self) -> &Plan {
        self.plan
            .get_or_init(|| async {
                let state = self.state;
                let catalog = match store::bounded(team_catalog(
                    &state.store,
                    &state.config.model_catalog,
                    self.team,
                ))
                .await
                {
                    Ok(catalog) => catalog,
                    Err(err) => {
                        tracing::warn!(turn = %self.turn, class = err.metric_label(), "model catalog unread: images not described");
                        return Plan::NoRoute;
                    }
                };
                let sees = |route: &str| catalog.facts(route).is_some_and(|f| f.vision);
                if self.model.is_none_or(sees) {
                    return Plan::Sees;
                }
                let route = chosen(&state.store, self.team, self.own, |d| d.vision).await;
                match route {
                    Some(route) if sees(&route) => Plan::Describe(route),
                    _ => Plan::NoRoute,
                }
            })
            .await
    }

    /// A new description of `image` by `route`, kept and billed; or a note saying why
    /// there is none.
    async fn ask(&self, route: &str, row: &ChatFileRow, image: &Attachment) -> String {
        let store = &self.state.store;
        let claim = store::bounded(store.claim_description(
            self.team,
            row.id,
            MAX_ATTEMPTS,
            DESCRIBE_BOUND,
        ))
        .await;
        match claim {
            Ok(DescriptionClaim::Claimed) => {}
            Ok(DescriptionClaim::Described(description)) => return described(image, &description),
            Ok(DescriptionClaim::Busy) => {
                return note(image, "its description is still being made");
            }
            Ok(DescriptionClaim::GivenUp | DescriptionClaim::Gone) => {
                return note(image, "its description could not be made");
            }
            Err(err) => {
                tracing::warn!(turn = %self.turn, class = err.metric_label(), "image description not claimed");
                return note(image, "its description could not be made");
            }
        }
        let request = OneShot {
            system: DESCRIBE_INSTRUCTIONS,
            prompt: format!("The image {}.", image.filename),
            files: vec![image.clone()],
            max_output_tokens: DESCRIBE_MAX_OUTPUT_TOKENS,
            what: "vision",
        };
        let routes = [route.to_owned()];
        let asked = one_shot(&self.state.connections, self.team, &routes, request);
        let (text, usage) = match tokio::time::timeout(DESCRIBE_BOUND, asked).await {
            Ok(Some(answer)) => answer,
            Ok(None) => return self.failed(row, image, "no_answer").await,
            Err(_) => return self.failed(row, image, "timeout").await,
        };
        let description: String = providers::strip_inline_reasoning(&text)
            .trim()
            .chars()
            .take(MAX_DESCRIPTION_CHARS)
            .collect();
        if description.is_empty() {
            return self.failed(row, image, "empty").await;
        }
        if let Err(err) =
            store::bounded(store.set_description(self.team, row.id, &description)).await
        {
            tracing::warn!(turn = %self.turn, file = %row.id, class = err.metric_label(), "image description not kept");
        }
        let key = format!("turn:{}:vision:{}", self.turn, row.id);
        if let Err(err) =
            store::bounded(store.record_usage(self.team, self.agent, self.turn, &key, &usage)).await
        {
            tracing::warn!(turn = %self.turn, class = err.metric_label(), "image description: usage not recorded");
        }
        let tokens = usage.input_tokens.unwrap_or(0) + usage.output_tokens.unwrap_or(0);
        self.state.holds.bill(self.team, self.user, tokens).await;
        described(image, &description)
    }

    /// The note for an image whose describing failed, its claim released so the next
    /// turn may try again while attempts remain.
    async fn failed(&self, row: &ChatFileRow, image: &Attachment, class: &'static str) -> String {
        tracing::info!(turn = %self.turn, file = %row.id, class, "image not described");
        let store = &self.state.store;
        if let Err(err) = store::bounded(store.release_description(self.team, row.id)).await {
            tracing::warn!(turn = %self.turn, file = %row.id, class = err.metric_label(), "image description claim not released");
        }
        note(image, "its description could not be made")
    }
}

impl Describe for Describer<'_> {
    /// Sets `image`'s `instead` (for a model without vision) to what the turn's model
    /// reads in its place: the kept description, a new one, or a note saying why there
    /// is none.
    async fn describe(&self, row: &ChatFileRow, image: &mut Attachment) {
        let route = match self.plan().await {
            Plan::Sees => return,
            Plan::NoRoute => {
                image.instead =
                    Some(note(image, "no vision route is configured to describe it").into());
                return;
            }
            Plan::Describe(route) => route,
        };
        let said = match &row.description {
            Some(description) => described(image, description),
            None => self.ask(route, row, image).await,
        };
        image.instead = Some(said.into());
    }
}

/// An image's description as the model reads it in the image's place.
fn described(image: &Attachment, description: &str) -> String {
    format!("[image {}, described: {description}]", image.filename)
}

/// The note that an image was attached, and why the model gets no description.
fn note(image: &Attachment, why: &str) -> String {
    format!(
        "[an image was attached here ({}, {}), but this model cannot read it, and {why}]",
        image.filename, image.media_type
    )
}
