//! Recording a request in the invocation log: a [`RunLog`] is opened when the request starts
//! and finished once; the record goes to the batched writer, never to the database directly.

use std::sync::Arc;
use std::time::Instant;

use baton_domain::chat::{InferenceResponse, Usage};
use baton_domain::credits::Credits;
use baton_domain::lifecycle::CallLifecycle;
use baton_domain::run::{Attempt, RawJson, RunKind, RunRecord, RunStatus, RunWarning, StoredEvent};
use baton_domain::settings::TenantSettings;
use baton_domain::{TenantId, Timestamp};
use baton_ledger::{Cost, Price, price_inference};
use baton_providers::Catalogue;
use serde_json::Value;

use crate::error::ExecutorError;
use crate::events::{CallInfo, EventLog, record_call_outcome};
use crate::storage::{RunItem, RunPromise, RunSink};

async fn write(writer: &dyn RunSink, record: Box<RunRecord>, events: Vec<StoredEvent>) {
    let tenant = record.tenant.clone();
    // A root run that is finished takes the log lines captured for its request.
    let lines = if record.status != RunStatus::Pending && record.id == record.root_id {
        crate::capture::take(&record.id)
    } else {
        Vec::new()
    };
    if let Err(err) = writer.queue(RunItem::Run(record)).await {
        tracing::error!(error = %err, "could not queue an invocation log row");
    }
    if let Some(tenant) = tenant.clone().filter(|_| !events.is_empty())
        && let Err(err) = writer.queue(RunItem::Events(tenant, events)).await
    {
        tracing::error!(error = %err, "could not queue stored events");
    }
    if let Some(tenant) = tenant.filter(|_| !lines.is_empty())
        && let Err(err) = writer.queue(RunItem::LogEntries(tenant, lines)).await
    {
        tracing::error!(error = %err, "could not queue captured log lines");
    }
}

/// What pricing needs to know about the request's tenant and model.
#[derive(Clone)]
pub struct Pricing {
    pub catalogue: Arc<Catalogue>,
    pub markup_percent: f64,
    /// Answers from the response cache cost nothing.
    free: bool,
}

impl Pricing {
    pub fn new(catalogue: Arc<Catalogue>, settings: &TenantSettings) -> Self {
        Self {
            catalogue,
            markup_percent: settings.markup_percent,
            free: false,
        }
    }

    /// The same pricing for an answer served from the response cache.
    pub fn for_cached(&self) -> Pricing {
        Pricing {
            free: true,
            ..self.clone()
        }
    }

    /// Prices by the served model, else the requested one; a model missing from the catalogue
    /// costs 0 and is flagged `pricingUncertain`.
    pub fn cost(&self, provider: &str, served: &str, requested: &str, usage: &Usage) -> Cost {
        if self.free {
            return Cost::default();
        }
        let descriptor = self
            .catalogue
            .lookup_served(provider, served)
            .or_else(|| self.catalogue.get(provider, requested));
        match descriptor {
            Some(d) => price_inference(
                usage,
                &Price::of(d, self.catalogue.web_search_fee(provider)),
                self.markup_percent,
            ),
            None => Cost::uncertain(),
        }
    }

    /// [`Pricing::cost`] of an answer, each model call it took priced on its own (a
    /// structured-output retry is two calls: DESIGN.md rounds per inference).
    pub fn cost_of_answer(
        &self,
        provider: &str,
        served: &str,
        requested: &str,
        response: &InferenceResponse,
    ) -> Cost {
        if response.discarded.is_empty() {
            return self.cost(provider, served, requested, &response.usage);
        }
        response
            .usage_per_call()
            .map(|usage| self.cost(provider, served, requested, &usage))
            .fold(Cost::default(), Cost::plus)
    }
}

/// The warning of a run whose usage was estimated (a stream cut before its usage arrived).
pub const USAGE_ESTIMATED: &str = "USAGE_ESTIMATED";
/// The usual rule of thumb for English text with the common tokenizers; an estimate for billing
/// what was streamed, not a count.
const CHARS_PER_TOKEN: usize = 4;

fn estimated_tokens(chars: usize) -> u64 {
    u64::try_from(chars.div_ceil(CHARS_PER_TOKEN)).unwrap_or(u64::MAX)
}

/// The tokens of what a stream cut short produced (its text and tool calls), estimated.
fn estimated_output_tokens(partial: &InferenceResponse) -> u64 {
    estimated_tokens(
        partial.text.chars().count()
            + partial
                .tool_calls
                .iter()
                .map(|c| c.name.chars().count() + c.arguments.chars().count())
                .sum::<usize>(),
    )
}

pub(crate) fn logged_response(
    response: &InferenceResponse,
    finish_reason: Option<&str>,
) -> RawJson {
    RawJson::of(&baton_domain::lifecycle::LoggedResponse {
        text: &response.text,
        tool_calls: &response.tool_calls,
        citations: &response.citations,
        finish_reason,
        refusal: response.refusal.as_deref(),
    })
}

/// Characters of the text in a logged request's messages (chat: `messages`; flow runs:
/// `request.messages`): the strings under `content` and `text` keys, so roles, ids and image
/// data are not counted.
fn prompt_chars(request: &Value) -> usize {
    fn text(value: &Value) -> usize {
        match value {
            Value::Array(items) => items.iter().map(text).sum(),
            Value::Object(map) => map
                .iter()
                .map(|(key, value)| match value {
                    Value::String(s) if key == "content" || key == "text" => s.chars().count(),
                    other => text(other),
                })
                .sum(),
            _ => 0,
        }
    }
    request
        .get("messages")
        .or_else(|| request.pointer("/request/messages"))
        .map_or(0, text)
}

/// The code of a run whose request was dropped before it finished (the client closed the
/// connection, so the handler was cancelled): written by `Drop`, so no run stays `Pending`.
pub const CLIENT_DISCONNECTED: &str = "CLIENT_DISCONNECTED";
/// The code of a run the service dropped unfinished as it shut down (past its grace period).
pub const SERVICE_SHUTDOWN: &str = "SERVICE_SHUTDOWN";

pub struct RunLog {
    /// Boxed: the log is moved into and held across the await points of every request's
    /// future, which would otherwise carry the record's ~700 bytes once per nesting level
    /// (docs/performance.md, "Smaller futures").
    record: Option<Box<RunRecord>>,
    /// Lifecycle events written with the run.
    events: Vec<StoredEvent>,
    started: Instant,
    writer: Arc<dyn RunSink>,
    pricing: Pricing,
}

/// The code of a run whose request panicked before it finished (a bug, not the client's doing).
pub const INTERNAL_ERROR: &str = "INTERNAL_ERROR";

/// A run dropped unfinished (its request future was cancelled: the client left a synchronous
/// call; or a panic unwound through it) is written as failed, from a task since `Drop` cannot
/// wait; what its calls had cost by then is not known here.
impl Drop for RunLog {
    fn drop(&mut self) {
        let Some(mut record) = self.record.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        record.status = RunStatus::Failed;
        let (code, message) = if std::thread::panicking() {
            (
                INTERNAL_ERROR,
                "the request failed on an internal error (the service's log has it)",
            )
        } else {
            self.cut_short("the client closed the connection before the run finished")
        };
        record.error_code = Some(code.to_string());
        record.error_message = Some(message.to_string());
        record.duration_ms = self.elapsed_ms();
        record.completed_at = Some(Timestamp::now());
        let writer = self.writer.clone();
        let events = std::mem::take(&mut self.events);
        runtime.spawn(async move { write(writer.as_ref(), record, events).await });
    }
}

impl RunLog {
    /// Why a run dropped unfinished ended: its client left (`client_left` says how), or the
    /// service, shutting down, dropped it.
    pub fn cut_short(&self, client_left: &'static str) -> (&'static str, &'static str) {
        if self.writer.service_stopping() {
            (
                SERVICE_SHUTDOWN,
                "the service shut down before the run finished",
            )
        } else {
            (CLIENT_DISCONNECTED, client_left)
        }
    }

    pub fn start(
        writer: Arc<dyn RunSink>,
        pricing: Pricing,
        id: String,
        tenant: TenantId,
        kind: RunKind,
        requested_model: String,
    ) -> RunLog {
        RunLog {
            record: Some(Box::new(RunRecord::pending(
                id,
                tenant,
                kind,
                requested_model,
            ))),
            events: Vec::new(),
            started: Instant::now(),
            writer,
            pricing,
        }
    }

    pub fn record_mut(&mut self) -> Option<&mut RunRecord> {
        self.record.as_deref_mut()
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Fills in the answer of a model call (whole or, `finished` false, cut before the
    /// provider's finish: no finish reason is invented for it) and prices it.
    fn settle(
        &mut self,
        provider: &str,
        model: &str,
        response: &InferenceResponse,
        finished: bool,
    ) {
        let served = if response.model.is_empty() {
            model
        } else {
            response.model.as_str()
        };
        let cost = self
            .pricing
            .cost_of_answer(provider, served, model, response);
        self.settle_priced(provider, model, response, finished, cost);
    }

    /// Like `settle`, with the cost already known (a request of several model calls, each
    /// priced by the model that served it).
    fn settle_priced(
        &mut self,
        provider: &str,
        model: &str,
        response: &InferenceResponse,
        finished: bool,
        cost: Cost,
    ) {
        let duration_ms = self.elapsed_ms();
        if let Some(record) = self.record.as_mut() {
            let served = if response.model.is_empty() {
                model
            } else {
                response.model.as_str()
            };
            record.provider = Some(provider.to_string());
            record.served_model = Some(format!("{provider}/{served}"));
            record.status = RunStatus::Succeeded;
            // A run with tools has counted its calls; any other answer is one call.
            record.inference_count = record.inference_count.max(response.calls());
            let finish_reason = finished.then(|| response.finish_reason.as_openai());
            record.finish_reason = finish_reason.map(str::to_string);
            record.usage = response.usage;
            record.cost_credits = cost.billed.0;
            record.raw_cost_credits = cost.raw.0;
            record.pricing_uncertain = cost.pricing_uncertain;
            record.duration_ms = duration_ms;
            // A sink that keeps nothing (the invocation log off) reads no body: none is built.
            record.response = self
                .writer
                .keeps_runs()
                .then(|| logged_response(response, finish_reason));
            record.completed_at = Some(Timestamp::now());
        }
    }

    pub async fn succeed(mut self, provider: &str, model: &str, response: &InferenceResponse) {
        self.settle(provider, model, response, true);
        self.flush().await;
    }

    /// A request of several model calls: `response` carries their summed usage, `cost` their
    /// summed cost.
    pub async fn succeed_priced(
        mut self,
        provider: &str,
        model: &str,
        response: &InferenceResponse,
        cost: Cost,
    ) {
        self.settle_priced(provider, model, response, true, cost);
        self.flush().await;
    }

    /// Ends the run as failed with `code` and `message`, now.
    fn mark_failed(&mut self, code: &str, message: &str) {
        let duration_ms = self.elapsed_ms();
        if let Some(record) = self.record.as_mut() {
            record.status = RunStatus::Failed;
            record.error_code = Some(code.to_string());
            record.error_message = Some(message.to_string());
            record.duration_ms = duration_ms;
            record.completed_at = Some(Timestamp::now());
        }
    }

    /// A multi-call request that failed after spending `cost` on earlier calls.
    /// `served`: `(provider, model)` of the model whose answers were billed, if any answered:
    /// reports per served model count a failed run's spend under it.
    pub async fn fail_priced(
        mut self,
        served: Option<(&str, &str)>,
        error: &ExecutorError,
        usage: Usage,
        cost: Cost,
    ) {
        self.mark_failed(error.code(), &error.to_string());
        if let Some(record) = self.record.as_mut() {
            if let Some((provider, model)) = served {
                record.provider = Some(provider.to_string());
                record.served_model = Some(format!("{provider}/{model}"));
            }
            record.usage = usage;
            record.cost_credits = cost.billed.0;
            record.raw_cost_credits = cost.raw.0;
            record.pricing_uncertain = cost.pricing_uncertain;
        }
        self.flush().await;
    }

    /// A request that got no answer. `spent` is what failed attempts still cost (a structured
    /// answer that was invalid twice); it is priced and billed, under the model that answered.
    /// A model that spent nothing (it refused or failed) served nothing: no served model, and no
    /// price of its to be uncertain of.
    pub async fn fail(mut self, model: Option<(&str, &str)>, error: &ExecutorError, spent: Usage) {
        let answered = model.filter(|_| spent != Usage::default());
        let cost =
            answered.map(|(provider, model)| self.pricing.cost(provider, model, model, &spent));
        self.mark_failed(error.code(), &error.to_string());
        if let Some(record) = self.record.as_mut() {
            if let Some((provider, _)) = model {
                record.provider = Some(provider.to_string());
            }
            if let Some((provider, model)) = answered {
                record.served_model = Some(format!("{provider}/{model}"));
            }
            if let Some(cost) = cost {
                record.usage = spent;
                record.cost_credits = cost.billed.0;
                record.raw_cost_credits = cost.raw.0;
                record.pricing_uncertain = cost.pricing_uncertain;
            }
        }
        self.flush().await;
    }

    /// The models tried, in order, and whether the answer came from a fallback.
    pub fn record_routing(&mut self, attempts: Vec<Attempt>, fallback_used: bool) {
        if let Some(record) = self.record.as_mut() {
            record.attempts.extend(attempts);
            // Several calls (a tool loop): any fallback marks the run.
            record.fallback_used |= fallback_used;
        }
    }

    /// The answer comes from the response cache: no provider call, so no cost.
    pub fn mark_cached(&mut self) {
        self.pricing = self.pricing.for_cached();
        if let Some(record) = self.record.as_mut() {
            record.was_cached = true;
        }
    }

    /// A stream that ended early (client gone or upstream broken): what was produced is kept
    /// and billed, its usage estimated if the provider had reported none. Returns the usage the
    /// run is billed on. `finished`: whether the provider had sent its finish (a stream that
    /// ended well but whose answer is refused); otherwise the logged finish reason is null, not
    /// an invented `stop`. A stream that produced nothing fails as a request that got no answer
    /// does: no served model, nothing billed.
    pub fn finish_partial(
        &mut self,
        provider: &str,
        model: &str,
        partial: &InferenceResponse,
        finished: bool,
        code: &str,
        message: &str,
    ) -> Usage {
        if !partial.has_output() {
            self.mark_failed(code, message);
            if let Some(record) = self.record.as_mut() {
                record.provider = Some(provider.to_string());
            }
            return Usage::default();
        }
        let mut billed = partial.clone();
        self.estimate_unreported(&mut billed);
        self.settle(provider, model, &billed, finished);
        if let Some(record) = self.record.as_mut() {
            record.error_code = Some(code.to_string());
            record.error_message = Some(message.to_string());
        }
        billed.usage
    }

    /// Most providers send usage only at the end of a stream, and some never (a compatible
    /// server that ignores `stream_options.include_usage`): an answer that came with no output
    /// tokens would bill nothing for what it said. Its usage is estimated instead (the prompt's
    /// too when none was reported), with the `USAGE_ESTIMATED` warning.
    pub fn estimate_unreported(&mut self, response: &mut InferenceResponse) {
        if !response.has_output() || response.usage.tokens_out != 0 {
            return;
        }
        response.usage.tokens_out = estimated_output_tokens(response);
        if response.usage.tokens_in == 0 {
            let prompt = self
                .record
                .as_ref()
                .and_then(|r| r.request.as_ref())
                .map_or(0, |request| prompt_chars(&request.to_value()));
            response.usage.tokens_in = estimated_tokens(prompt);
        }
        self.note_estimated_usage();
    }

    /// Warns that the run is billed on estimated tokens (`USAGE_ESTIMATED`): a stream was cut
    /// before its provider reported usage.
    fn note_estimated_usage(&mut self) {
        if let Some(record) = self.record.as_mut()
            && !record.warnings.iter().any(|w| w.code == USAGE_ESTIMATED)
        {
            record.warnings.push(RunWarning {
                code: USAGE_ESTIMATED.into(),
                message: format!(
                    "the provider reported no usage for what was streamed (the stream ended \
                     before it, or it sends none); tokens are estimated at {CHARS_PER_TOKEN} \
                     characters per token"
                ),
                parameter: None,
            });
        }
    }

    /// Queues the run as `Pending` now, so it can be found (and cancelled) while it runs; the
    /// final write replaces the row.
    pub async fn queue_pending(&self) {
        if let Some(record) = &self.record
            && let Err(err) = self.writer.queue(RunItem::Run(record.clone())).await
        {
            tracing::warn!(error = %err, "could not queue a pending run row");
        }
    }

    /// Queues the run as `Pending` now if it holds budget: a process that stops before the run
    /// finishes (killed, crashed) then leaves a row the abandoned-run sweep finishes, giving
    /// the holds back; without it they would stay reserved until the budget period ends.
    /// Only holders pay for the extra row.
    pub async fn queue_pending_if_holding(&self) {
        if self
            .record
            .as_ref()
            .is_some_and(|record| !record.budget_holds.is_empty())
        {
            self.queue_pending().await;
        }
    }

    /// The warnings recorded on the run so far (`None` once it is finished).
    pub fn warnings(&self) -> Option<&[RunWarning]> {
        self.record
            .as_ref()
            .map(|record| record.warnings.as_slice())
    }

    /// An answered one-call request's lifecycle, kept with the run in place of its events.
    pub fn keep_lifecycle(&mut self, lifecycle: CallLifecycle) {
        if let Some(record) = self.record.as_mut() {
            record.lifecycle = Some(Box::new(lifecycle));
        }
    }

    pub fn attach_events(&mut self, events: Vec<StoredEvent>) {
        self.events.extend(events);
    }

    pub async fn flush(mut self) {
        if let Some(record) = self.record.take() {
            write(
                self.writer.as_ref(),
                record,
                std::mem::take(&mut self.events),
            )
            .await;
        }
    }

    /// For `Drop` paths that cannot await: queues from a task.
    pub fn flush_in_background(mut self) {
        if let Some(record) = self.record.take() {
            let writer = self.writer.clone();
            let events = std::mem::take(&mut self.events);
            tokio::spawn(async move { write(writer.as_ref(), record, events).await });
        }
    }

    /// A promise to queue this run after the reply, when it may be ([`RunSink::promise_run`]:
    /// the invocation log is on and the writer keeps up); [`finish_run`] keeps it.
    fn after_reply(&self) -> Option<RunPromise> {
        self.writer.promise_run()
    }

    /// The request as the log keeps it, serialised now (nothing else holds it as JSON).
    pub fn set_request<T: serde::Serialize>(&mut self, request: &T) {
        if !self.writer.keeps_runs() {
            return;
        }
        if let Some(record) = self.record.as_mut() {
            record.request = Some(RawJson::of(request));
        }
    }
}

/// The end of a synchronous one-call request that answered (a chat completion, an inference
/// call, a flow run without tools): its lifecycle kept with the run (or, when other events were
/// recorded, its completion events recorded), the run settled and queued, off the client's wait while the writer keeps up ([`finish_run`]). `call` has been
/// told the model that served ([`CallInfo::served_by`]); `billed` is the answer's price.
pub async fn finish_answered_call(
    mut log: RunLog,
    mut events: EventLog,
    call: CallInfo,
    response: InferenceResponse,
    billed: Credits,
) {
    let promise = log.after_reply();
    finish_run(promise, async move {
        match events.answered_call_lifecycle(&call, &response, billed, true) {
            Some(lifecycle) => log.keep_lifecycle(lifecycle),
            None => {
                record_call_outcome(&mut events, &call, Ok((&response, billed)));
                log.attach_events(events.take_stored());
            }
        }
        log.succeed(&call.provider_key, &call.model, &response)
            .await;
    })
    .await;
}

/// Runs `finish`, a run's last log work, off the client's wait when `promise` allows: spawned
/// on the current runtime, which on a serving thread (single-threaded) runs it once the
/// connection's task next waits, after hyper has written the reply. The promise is held until
/// the run is queued, so a read of the run by id waits for it. Without a promise `finish` runs
/// now, before the reply.
async fn finish_run<F>(promise: Option<RunPromise>, finish: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match promise {
        Some(promise) => {
            tokio::spawn(async move {
                finish.await;
                drop(promise);
            });
        }
        None => finish.await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Mutex;

    /// Keeps the runs queued to it, and says whether it keeps them.
    struct Captured {
        keeps: bool,
        runs: Mutex<Vec<RunRecord>>,
    }

    #[async_trait::async_trait]
    impl RunSink for Captured {
        async fn queue(&self, item: RunItem) -> crate::ExecutorResult<()> {
            if let RunItem::Run(record) = item {
                self.runs.lock().unwrap().push(*record);
            }
            Ok(())
        }

        fn keeps_runs(&self) -> bool {
            self.keeps
        }
    }

    /// The request and response bodies are serialised only for a sink that keeps runs (with
    /// the invocation log off nothing reads them); the outcome is recorded either way.
    #[tokio::test]
    async fn bodies_are_kept_only_for_a_sink_that_keeps_runs() {
        let catalogue = Arc::new(Catalogue::shipped().unwrap());
        for keeps in [true, false] {
            let sink = Arc::new(Captured {
                keeps,
                runs: Mutex::new(Vec::new()),
            });
            let pricing = Pricing::new(catalogue.clone(), &TenantSettings::default());
            let mut log = RunLog::start(
                sink.clone(),
                pricing,
                "r1".into(),
                TenantId::new("acme"),
                RunKind::Chat,
                "openai/gpt-4o-mini".into(),
            );
            log.set_request(&json!({"messages": [{"role": "user", "content": "hi"}]}));
            let response = InferenceResponse {
                text: "hello".into(),
                ..InferenceResponse::default()
            };
            log.succeed("openai", "gpt-4o-mini", &response).await;
            let runs = sink.runs.lock().unwrap();
            assert_eq!(runs.len(), 1);
            assert_eq!(runs[0].status, RunStatus::Succeeded);
            assert_eq!(runs[0].served_model.as_deref(), Some("openai/gpt-4o-mini"));
            assert_eq!(runs[0].request.is_some(), keeps, "keeps: {keeps}");
            assert_eq!(runs[0].response.is_some(), keeps, "keeps: {keeps}");
        }
    }

    /// A run dropped by a panic is the service's failure, not the client's leaving.
    #[tokio::test]
    async fn a_run_dropped_unfinished_says_whether_the_client_left_or_a_panic_unwound() {
        let catalogue = Arc::new(Catalogue::shipped().unwrap());
        let sink = Arc::new(Captured {
            keeps: true,
            runs: Mutex::new(Vec::new()),
        });
        let start = |id: &str| {
            RunLog::start(
                sink.clone(),
                Pricing::new(catalogue.clone(), &TenantSettings::default()),
                id.into(),
                TenantId::new("acme"),
                RunKind::Chat,
                "openai/gpt-4o-mini".into(),
            )
        };
        drop(start("left"));
        let log = start("panicked");
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _log = log;
            panic!("a bug in a handler");
        }));
        assert!(unwound.is_err());
        // Written from spawned tasks.
        for _ in 0..100 {
            if sink.runs.lock().unwrap().len() == 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let runs = sink.runs.lock().unwrap();
        let code = |id: &str| {
            let run = runs.iter().find(|r| r.id == id).unwrap();
            assert_eq!(run.status, RunStatus::Failed);
            run.error_code.clone()
        };
        assert_eq!(code("left").as_deref(), Some(CLIENT_DISCONNECTED));
        assert_eq!(code("panicked").as_deref(), Some(INTERNAL_ERROR));
    }

    #[test]
    fn the_prompt_estimate_counts_message_text_only() {
        let chat = json!({"model": "m", "messages": [
            {"role": "system", "content": "12345678"},
            {"role": "user", "content": [{"type": "text", "text": "abcd"},
                                         {"type": "image_url", "image_url": {"url": "data:AAAA"}}]}]});
        assert_eq!(prompt_chars(&chat), 12);
        let flow =
            json!({"flowId": "f", "request": {"messages": [{"role": "user", "content": "héllo"}]}});
        assert_eq!(prompt_chars(&flow), 5);
        assert_eq!(estimated_tokens(0), 0);
        assert_eq!(estimated_tokens(5), 2);
    }
}
