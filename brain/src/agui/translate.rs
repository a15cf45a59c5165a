//! UI chunks in, AG-UI events out.
//!
//! The turn's assistant message is one AG-UI message: every text part and every tool call
//! of the turn hangs off the stored message's id (the `start` chunk's), as the transcript
//! keeps them. The AG-UI client checks the order of what it reads (a text message or tool
//! call must be open before its content, closed before `RUN_FINISHED`, nothing after the
//! run's end), so the translator closes what is open before it ends the run and drops
//! whatever the turn writes after an error.

use std::collections::HashMap;

use protocol::ErrorCode;
use protocol::ui::{ConnectorStatus, FinishReason, UiChunk, WorkerStatus};
use serde_json::{Value, json};

use super::events::{Event, Interrupt, Outcome};

/// The state of one run's translation.
pub struct Translator {
    thread: String,
    run: String,
    /// The assistant message's id; every text and tool call of the turn belongs to it.
    message: Option<String>,
    /// The UI text part currently open (AG-UI streams one text message at a time).
    text_open: bool,
    /// Tool calls by id: whether their `TOOL_CALL_END` was sent, and their name.
    calls: HashMap<String, Call>,
    step: Option<String>,
    steps: u32,
    interrupts: Vec<Interrupt>,
    /// What `STATE_SNAPSHOT` carries.
    turn: Option<String>,
    connectors: Vec<ConnectorStatus>,
    worker: Option<WorkerStatus>,
    /// `RUN_FINISHED` or `RUN_ERROR` was sent.
    ended: bool,
}

struct Call {
    name: String,
    args_sent: bool,
    ended: bool,
}

impl Translator {
    pub fn new(thread: String, run: String) -> Self {
        Self {
            thread,
            run,
            message: None,
            text_open: false,
            calls: HashMap::new(),
            step: None,
            steps: 0,
            interrupts: Vec::new(),
            turn: None,
            connectors: Vec::new(),
            worker: None,
            ended: false,
        }
    }

    pub fn started(&self) -> Event {
        Event::RunStarted {
            thread_id: self.thread.clone(),
            run_id: self.run.clone(),
        }
    }

    /// Whether the run's last event was sent.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The events `chunk` becomes; none once the run ended.
    pub fn push(&mut self, chunk: UiChunk) -> Vec<Event> {
        if self.ended {
            return Vec::new();
        }
        let mut out = Vec::new();
        match chunk {
            UiChunk::Start { message_id } => self.message = Some(message_id),
            UiChunk::StartStep => self.start_step(&mut out),
            UiChunk::FinishStep => {
                self.close_text(&mut out);
                self.close_step(&mut out);
            }
            UiChunk::TextStart { .. } => self.open_text(&mut out),
            UiChunk::TextDelta { delta, .. } => self.text(&mut out, delta),
            UiChunk::TextEnd { .. } => self.close_text(&mut out),
            UiChunk::ToolInputStart {
                tool_call_id,
                tool_name,
            } => self.open_call(&mut out, &tool_call_id, &tool_name),
            UiChunk::ToolInputDelta {
                tool_call_id,
                input_text_delta,
            } => self.call_args(&mut out, tool_call_id, input_text_delta),
            UiChunk::ToolInputAvailable {
                tool_call_id,
                tool_name,
                input,
            } => self.call_input(&mut out, tool_call_id, &tool_name, &input),
            UiChunk::ToolOutputAvailable {
                tool_call_id,
                output,
            } => {
                let content = match output {
                    Value::String(text) => text,
                    other => other.to_string(),
                };
                self.result(&mut out, tool_call_id, content);
            }
            UiChunk::ToolOutputError {
                tool_call_id,
                error_text,
            } => self.result(&mut out, tool_call_id, error_text),
            UiChunk::ToolOutputDenied { tool_call_id } => self.result(
                &mut out,
                tool_call_id,
                "denied: the call did not run".to_owned(),
            ),
            UiChunk::ToolApprovalRequest {
                approval_id,
                tool_call_id,
            } => self.approval_request(approval_id, tool_call_id),
            UiChunk::Finish { finish_reason } => {
                let outcome = self.outcome(finish_reason);
                self.finish(&mut out, outcome);
            }
            UiChunk::Error { error_text } => self.failed(&mut out, &error_text),
            UiChunk::DataTurn { data, .. } => {
                self.turn = Some(data.turn_id.to_string());
                out.push(self.snapshot());
            }
            UiChunk::DataConnectorStatus { data } => {
                self.connectors.retain(|c| c.name != data.name);
                self.connectors.push(data);
                out.push(self.snapshot());
            }
            UiChunk::DataWorkerStatus { data } => {
                self.worker = Some(data);
                out.push(self.snapshot());
            }
            passed @ (UiChunk::DataNotice { .. }
            | UiChunk::DataElicitation { .. }
            | UiChunk::SourceDocument { .. }
            | UiChunk::DataWorkerLog { .. }
            | UiChunk::DataDelegation { .. }) => out.extend(passed_on(passed)),
            // Only a resumed stream (D5) or the events stream writes these, never the
            // stream of the request that starts the turn.
            UiChunk::ResetStep | UiChunk::DataResync { .. } => {}
            // T18: reasoning an agent opted to stream is the AI SDK client's; an AG-UI run
            // shows the answer only.
            UiChunk::ReasoningStart { .. }
            | UiChunk::ReasoningDelta { .. }
            | UiChunk::ReasoningEnd { .. } => {}
        }
        out
    }

    fn start_step(&mut self, out: &mut Vec<Event>) {
        self.close_step(out);
        self.steps += 1;
        let name = format!("model_call_{}", self.steps);
        self.step = Some(name.clone());
        out.push(Event::StepStarted { step_name: name });
    }

    fn text(&mut self, out: &mut Vec<Event>, delta: String) {
        if !delta.is_empty() {
            self.open_text(out);
            out.push(Event::TextMessageContent {
                message_id: self.message_id(),
                delta,
            });
        }
    }

    fn call_args(&mut self, out: &mut Vec<Event>, tool_call_id: String, delta: String) {
        if let Some(call) = self.calls.get_mut(&tool_call_id)
            && !call.ended
            && !delta.is_empty()
        {
            call.args_sent = true;
            out.push(Event::ToolCallArgs {
                tool_call_id,
                delta,
            });
        }
    }

    /// The whole input of a call: its arguments unless they were streamed, and its end.
    fn call_input(
        &mut self,
        out: &mut Vec<Event>,
        tool_call_id: String,
        tool_name: &str,
        input: &Value,
    ) {
        self.open_call(out, &tool_call_id, tool_name);
        if let Some(call) = self.calls.get_mut(&tool_call_id)
            && !call.ended
        {
            if !call.args_sent {
                out.push(Event::ToolCallArgs {
                    tool_call_id: tool_call_id.clone(),
                    delta: input.to_string(),
                });
            }
            call.ended = true;
            out.push(Event::ToolCallEnd { tool_call_id });
        }
    }

    /// Kept for the run's end, where AG-UI carries interrupts.
    fn approval_request(&mut self, approval_id: String, tool_call_id: String) {
        let tool = self
            .calls
            .get(&tool_call_id)
            .map_or("a tool", |c| c.name.as_str())
            .to_owned();
        self.interrupts
            .push(Interrupt::approval(approval_id, tool_call_id, &tool));
    }

    fn outcome(&mut self, finish_reason: FinishReason) -> Outcome {
        match finish_reason {
            FinishReason::Interrupted => Outcome::Cancelled,
            _ if !self.interrupts.is_empty() => Outcome::Interrupt {
                interrupts: std::mem::take(&mut self.interrupts),
            },
            _ => Outcome::Success,
        }
    }

    /// The stream's error text is `code: message`; one without a code is internal.
    fn failed(&mut self, out: &mut Vec<Event>, error_text: &str) {
        let (code, message) = error_text
            .split_once(": ")
            .unwrap_or((ErrorCode::Internal.as_str(), error_text));
        self.ended = true;
        out.push(Event::RunError {
            message: message.to_owned(),
            code: code.to_owned(),
        });
    }

    /// The events after the turn's stream closed: a run that did not end yet failed.
    pub fn end(&mut self) -> Vec<Event> {
        if self.ended {
            return Vec::new();
        }
        self.ended = true;
        vec![Event::RunError {
            message: "the turn's stream ended before the turn did".into(),
            code: ErrorCode::Internal.as_str().into(),
        }]
    }

    /// A run that started nothing and waits on these approvals (a resume that answered
    /// only some of them).
    pub fn waiting(&mut self, interrupts: Vec<Interrupt>) -> Vec<Event> {
        let mut out = Vec::new();
        let outcome = if interrupts.is_empty() {
            Outcome::Success
        } else {
            Outcome::Interrupt { interrupts }
        };
        self.finish(&mut out, outcome);
        out
    }

    /// A message queued behind the agent's running turn (T13): this run ends; the
    /// queued turn runs later and answers in the chat.
    pub fn queued(&mut self, turn: String, position: u32) -> Vec<Event> {
        let mut out = Vec::new();
        self.turn = Some(turn.clone());
        out.push(self.snapshot());
        self.finish(&mut out, Outcome::Success);
        if let Some(Event::RunFinished { result, .. }) = out.last_mut() {
            *result = Some(json!({"queued": {"turnId": turn, "position": position}}));
        }
        out
    }

    fn finish(&mut self, out: &mut Vec<Event>, outcome: Outcome) {
        self.close_text(out);
        let open: Vec<String> = self
            .calls
            .iter_mut()
            .filter(|(_, c)| !c.ended)
            .map(|(id, c)| {
                c.ended = true;
                id.clone()
            })
            .collect();
        for tool_call_id in open {
            out.push(Event::ToolCallEnd { tool_call_id });
        }
        self.close_step(out);
        self.ended = true;
        out.push(Event::RunFinished {
            thread_id: self.thread.clone(),
            run_id: self.run.clone(),
            result: self.turn.as_ref().map(|t| json!({"turnId": t})),
            outcome,
        });
    }

    fn message_id(&self) -> String {
        // The `start` chunk comes first on every turn stream; the run id stands in for a
        // stream that would lack it, so events still name one message.
        self.message.clone().unwrap_or_else(|| self.run.clone())
    }

    fn open_text(&mut self, out: &mut Vec<Event>) {
        if !self.text_open {
            self.text_open = true;
            out.push(Event::TextMessageStart {
                message_id: self.message_id(),
                role: "assistant",
            });
        }
    }

    fn close_text(&mut self, out: &mut Vec<Event>) {
        if self.text_open {
            self.text_open = false;
            out.push(Event::TextMessageEnd {
                message_id: self.message_id(),
            });
        }
    }

    fn close_step(&mut self, out: &mut Vec<Event>) {
        if let Some(step_name) = self.step.take() {
            out.push(Event::StepFinished { step_name });
        }
    }

    fn open_call(&mut self, out: &mut Vec<Event>, id: &str, name: &str) {
        if self.calls.contains_key(id) {
            return;
        }
        // A text message and a tool call may not interleave on one message id.
        self.close_text(out);
        self.calls.insert(
            id.to_owned(),
            Call {
                name: name.to_owned(),
                args_sent: false,
                ended: false,
            },
        );
        out.push(Event::ToolCallStart {
            tool_call_id: id.to_owned(),
            tool_call_name: name.to_owned(),
            parent_message_id: self.message_id(),
        });
    }

    fn result(&mut self, out: &mut Vec<Event>, tool_call_id: String, content: String) {
        if let Some(call) = self.calls.get_mut(&tool_call_id)
            && !call.ended
        {
            call.ended = true;
            out.push(Event::ToolCallEnd {
                tool_call_id: tool_call_id.clone(),
            });
        }
        out.push(Event::ToolCallResult {
            message_id: format!("{tool_call_id}:result"),
            tool_call_id,
            content,
            role: "tool",
        });
    }

    fn snapshot(&self) -> Event {
        Event::StateSnapshot {
            snapshot: json!({
                "chatId": self.thread,
                "turnId": self.turn,
                "connectors": self.connectors,
                "worker": self.worker,
            }),
        }
    }
}

fn custom(name: &str, value: Value) -> Event {
    Event::Custom {
        name: name.into(),
        value,
    }
}

/// The chunks an AG-UI client gets as custom events of their own.
fn passed_on(chunk: UiChunk) -> Option<Event> {
    match chunk {
        UiChunk::DataNotice { data } => Some(custom(
            "notice",
            json!({"code": data.code, "message": data.message}),
        )),
        // P5: an AG-UI client sees the question; it answers it through the approvals
        // API like any client.
        UiChunk::DataElicitation { data, .. } => Some(custom(
            "elicitation",
            serde_json::to_value(&data).unwrap_or_default(),
        )),
        // B5: a citation, as the AI SDK chunk.
        source @ UiChunk::SourceDocument { .. } => Some(custom(
            "source_document",
            serde_json::to_value(&source).unwrap_or_default(),
        )),
        UiChunk::DataWorkerLog { data, .. } => Some(custom(
            "worker_log",
            json!({"toolCallId": data.tool_call_id, "stream": data.stream,
                       "text": data.text}),
        )),
        // B7: a delegated task's progress, as the chunk's own data.
        UiChunk::DataDelegation { data, .. } => Some(custom(
            "delegation",
            serde_json::to_value(&data).unwrap_or_default(),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| {
                serde_json::to_value(e).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    }

    fn run(chunks: Vec<UiChunk>) -> Vec<Event> {
        let mut t = Translator::new("thread".into(), "run".into());
        let mut out = vec![t.started()];
        for chunk in chunks {
            out.extend(t.push(chunk));
        }
        out.extend(t.end());
        out
    }

    #[test]
    fn a_tool_call_then_text_is_one_message_with_a_call_and_a_result() {
        let events = run(vec![
            UiChunk::Start {
                message_id: "m".into(),
            },
            UiChunk::StartStep,
            UiChunk::ToolInputStart {
                tool_call_id: "c".into(),
                tool_name: "memory_write".into(),
            },
            UiChunk::ToolInputDelta {
                tool_call_id: "c".into(),
                input_text_delta: "{}".into(),
            },
            UiChunk::ToolInputAvailable {
                tool_call_id: "c".into(),
                tool_name: "memory_write".into(),
                input: json!({}),
            },
            UiChunk::ToolOutputAvailable {
                tool_call_id: "c".into(),
                output: json!("saved"),
            },
            UiChunk::FinishStep,
            UiChunk::StartStep,
            UiChunk::TextStart { id: "t".into() },
            UiChunk::TextDelta {
                id: "t".into(),
                delta: "ok".into(),
            },
            UiChunk::TextEnd { id: "t".into() },
            UiChunk::FinishStep,
            UiChunk::Finish {
                finish_reason: FinishReason::Stop,
            },
            UiChunk::FinishStep,
        ]);
        assert_eq!(
            types(&events),
            [
                "RUN_STARTED",
                "STEP_STARTED",
                "TOOL_CALL_START",
                "TOOL_CALL_ARGS",
                "TOOL_CALL_END",
                "TOOL_CALL_RESULT",
                "STEP_FINISHED",
                "STEP_STARTED",
                "TEXT_MESSAGE_START",
                "TEXT_MESSAGE_CONTENT",
                "TEXT_MESSAGE_END",
                "STEP_FINISHED",
                "RUN_FINISHED",
            ]
        );
    }

    #[test]
    fn an_error_ends_the_run_with_its_code_and_nothing_follows() {
        let events = run(vec![
            UiChunk::StartStep,
            UiChunk::TextDelta {
                id: "t".into(),
                delta: "part".into(),
            },
            UiChunk::error(ErrorCode::ProviderUnavailable, "down"),
            UiChunk::Finish {
                finish_reason: FinishReason::Error,
            },
        ]);
        let last = serde_json::to_value(events.last().unwrap()).unwrap();
        assert_eq!(
            last,
            json!({"type": "RUN_ERROR", "code": "provider_unavailable", "message": "down"})
        );
        assert_eq!(
            types(&events)
                .iter()
                .filter(|t| t.starts_with("RUN_"))
                .count(),
            2
        );
    }

    #[test]
    fn a_pending_approval_ends_the_run_as_an_interrupt() {
        let events = run(vec![
            UiChunk::ToolInputAvailable {
                tool_call_id: "c".into(),
                tool_name: "shell".into(),
                input: json!({"cmd": "ls"}),
            },
            UiChunk::ToolApprovalRequest {
                approval_id: "a".into(),
                tool_call_id: "c".into(),
            },
            UiChunk::Finish {
                finish_reason: FinishReason::ToolCalls,
            },
        ]);
        let last = serde_json::to_value(events.last().unwrap()).unwrap();
        assert_eq!(last["outcome"]["type"], "interrupt");
        assert_eq!(last["outcome"]["interrupts"][0]["id"], "a");
        assert_eq!(last["outcome"]["interrupts"][0]["toolCallId"], "c");
        assert_eq!(
            types(&events)[1..4],
            ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"]
        );
    }

    #[test]
    fn a_stream_that_stops_short_is_a_run_error() {
        let events = run(vec![UiChunk::TextDelta {
            id: "t".into(),
            delta: "x".into(),
        }]);
        assert_eq!(types(&events).last().unwrap(), "RUN_ERROR");
    }
}
