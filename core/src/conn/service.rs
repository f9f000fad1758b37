//! The half of a connection that needs the instance: [`Connection::serve`] decides each
//! answer (who asks, which method, what result), holds an answer that acknowledges a change
//! until the change is durable, and leaves the costly framing to [`Connection::produce`].

use super::*;

impl Connection {
    /// Holds the output written from `start` on until change `seq` is durable.
    pub(super) fn hold_from(
        &mut self,
        inst: &mut Instance,
        start: usize,
        seq: u64,
        instead: Instead,
    ) {
        if !inst.must_hold(seq) || self.holds.back().is_some_and(|h| h.seq >= seq) {
            // Durable already, or behind a hold that waits for as much.
            return;
        }
        if self.holds.is_empty() {
            inst.set_holding(true);
        }
        self.holds.push_back(Hold {
            start,
            seq,
            instead,
        });
        let key = self.key(inst);
        inst.wait_durable(seq, key);
    }

    /// Releases the holds whose changes are durable now; gives them up if the store cannot
    /// make them durable.
    pub(super) fn release(&mut self, inst: &mut Instance, now: Now) {
        let had = !self.holds.is_empty();
        while self.holds.front().is_some_and(|h| !inst.must_hold(h.seq)) {
            self.holds.pop_front();
        }
        if had && self.holds.is_empty() {
            inst.set_holding(false);
        }
        if !self.holds.is_empty() && inst.store_unavailable().is_some() {
            self.give_up_holds(inst, now);
        }
    }

    /// The store failed before the held answers' changes were durable: nothing may
    /// acknowledge them. The first held answer becomes a STORE_UNAVAILABLE refusal; what
    /// follows it is dropped, whatever the connection was doing ends, and it closes.
    pub(super) fn give_up_holds(&mut self, inst: &mut Instance, now: Now) {
        let Some(first) = self.holds.pop_front() else {
            return;
        };
        self.holds.clear();
        inst.set_holding(false);
        self.out.truncate(first.start);
        self.tail = None;
        self.deferred = None;
        // Frames are only ever queued behind the first hold.
        self.frames.clear();
        self.release_large(usize::MAX);
        self.end_state(inst);
        let why = inst.store_unavailable().unwrap_or_default().to_owned();
        let err = RpcError::new(
            ErrorKind::StoreUnavailable,
            format!(
                "the store could not make this change durable ({why}); it may or may not \
                 be kept: read the task again once the store has healed"
            ),
        );
        match first.instead {
            Instead::Rpc { id, minor } => self.write_error_reply(&err, &id, false, minor, now),
            Instead::StreamFrame { id, chunked } => {
                let mut doc = Vec::with_capacity(256);
                jsonrpc::write_error(&mut doc, &id, &err);
                response::write_sse_event(&mut self.out, &doc, chunked);
                if chunked {
                    response::write_chunked_end(&mut self.out);
                }
                self.note_error(err.kind);
            }
            Instead::OAuth { minor } => {
                let date = self.date(now);
                let mut h = Head::new(503, &date)
                    .header("content-type", "application/json")
                    .header("cache-control", "no-store")
                    .header("retry-after", "5");
                self.finish_head(&mut h, minor, false, now);
                h.write_full(
                    &mut self.out,
                    br#"{"error":"temporarily_unavailable","error_description":"the store cannot write; try again"}"#,
                    false,
                );
            }
        }
        self.closing = true;
    }

    /// The half of [`Connection::poll`] that needs the instance: decides the answers to
    /// the requests read (who asks, which method, what result) and takes what the instance
    /// has for this connection (a settled task, stream events, feed events, a host's
    /// answer). A driver that shares the instance behind a lock calls this under the lock,
    /// then [`Connection::produce`] outside it: a task, a card or a result is framed there,
    /// and TLS encrypts there.
    pub fn serve(&mut self, inst: &mut Instance, now: Now) {
        self.last_mono = now.mono_ms;
        self.prepare_late(inst, now);
        if std::mem::take(&mut self.peer_closed) {
            self.handle_eof(inst, now);
            return;
        }
        self.drive(inst, now);
    }

    /// Runs the state machine as far as it can go without new input. What it decides to
    /// answer is framed by [`Connection::produce`], and encrypted there.
    pub(super) fn drive(&mut self, inst: &mut Instance, now: Now) {
        self.release(inst, now);
        loop {
            if self.answering() {
                // The answer being written goes out first; what comes after it waits.
                break;
            }
            let progressed = match self.state {
                State::Reading { .. } => self.read_requests(inst, now),
                State::Waiting { .. } => self.pump_wait(inst, now),
                State::Streaming { .. } => self.pump_stream(inst, now),
                State::Calling { .. } => self.pump_call(inst, now),
                State::Feed { .. } => self.pump_feed(inst, now),
            };
            if !progressed || self.closing {
                break;
            }
        }
        self.release(inst, now);
        match (&self.state, self.reading_head()) {
            (State::Reading { .. }, true) if self.head_started.is_none() => {
                self.head_started = Some(now.mono_ms)
            }
            (State::Reading { .. }, false) => self.head_started = None,
            _ => {}
        }
        self.note_output(now);
    }

    /// Reads and answers buffered requests. True when it moved to another state.
    pub(super) fn read_requests(&mut self, inst: &mut Instance, now: Now) -> bool {
        while !self.closing && !self.answering() && self.backlog() < self.limits.max_output_bytes {
            if self.ahead.is_empty() {
                self.read_ahead();
            }
            let event = match self.ahead.pop_front() {
                Some(Ok(e)) => e,
                None => return false,
                Some(Err(e)) => {
                    self.refuse_and_close(e.status, e.reason, now);
                    return false;
                }
            };
            match event {
                Event::Head(head) => {
                    self.head_started = None;
                    self.body_started = Some(now.mono_ms);
                    self.req_started = now.mono_ms;
                    self.begin_request(inst, &head);
                    self.current =
                        (self.keep == Keep::All).then(|| self.new_record(Some(&head), now.mono_ms));
                    let mut route = route(&head);
                    if inst.config().device_grant.enabled {
                        if let Some(endpoint) = crate::oauth::Endpoint::from_path(&head.path) {
                            let wanted = if endpoint.takes_form() {
                                Method::Post
                            } else {
                                Method::Get
                            };
                            route = if head.method == wanted {
                                Route::OAuth(endpoint)
                            } else {
                                Route::Refuse {
                                    status: 405,
                                    allow: Some(if endpoint.takes_form() { "POST" } else { "GET" }),
                                }
                            };
                        }
                    }
                    let console = inst.config().console;
                    if !console.is_empty() && crate::statics::under_console(&head.path) {
                        route = match (crate::statics::lookup(console, &head.path), &head.method) {
                            (None, _) => Route::Refuse {
                                status: 404,
                                allow: None,
                            },
                            (Some(file), Method::Get) => Route::Static {
                                file,
                                head_only: false,
                            },
                            (Some(file), Method::Head) => Route::Static {
                                file,
                                head_only: true,
                            },
                            (Some(_), _) => Route::Refuse {
                                status: 405,
                                allow: Some(crate::statics::STATIC_ALLOW),
                            },
                        };
                    }
                    self.cors = cors_standing(inst, self.listener, &head, &route);
                    if self.cors == Cors::Refused {
                        // Before the body is read, and never counted as a failed credential.
                        route = Route::Refuse {
                            status: 403,
                            allow: None,
                        };
                    }
                    self.count_request(match route {
                        Route::Rpc => MethodLabel::UnknownRpc,
                        Route::Card { .. } => MethodLabel::Card,
                        Route::OAuth(_) => MethodLabel::OAuth,
                        Route::Metrics { .. } => MethodLabel::Metrics,
                        Route::Health { ready: false, .. } => MethodLabel::Healthz,
                        Route::Health { ready: true, .. } => MethodLabel::Readyz,
                        Route::Static { .. } | Route::Options { .. } | Route::Refuse { .. } => {
                            MethodLabel::Other
                        }
                    });
                    if let Route::Refuse { status, allow } = route {
                        if head.has_body() {
                            // Refused from its head: its body is never read, so the byte
                            // stream can no longer be trusted to find the next request.
                            self.write_simple(status, allow, now, &head, true);
                            self.closing = true;
                            return false;
                        }
                    }
                    if head.expect_continue && matches!(route, Route::Rpc) {
                        self.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                    }
                    self.state = State::Reading {
                        pending: Some((head, route)),
                    };
                }
                Event::Body(body) => {
                    self.body_started = None;
                    self.idle_since = now.mono_ms;
                    let State::Reading { pending } = &mut self.state else {
                        unreachable!("bodies are read only in the reading state")
                    };
                    let Some((head, route)) = pending.take() else {
                        self.refuse_and_close(400, "body without a request", now);
                        return false;
                    };
                    if self.answer(inst, head, route, &body, now) {
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Answers one complete request. True when the answer is pending (wait or stream).
    pub(super) fn answer(
        &mut self,
        inst: &mut Instance,
        head: RequestHead,
        route: Route,
        body: &[u8],
        now: Now,
    ) -> bool {
        match route {
            Route::Refuse { status, allow } => {
                self.write_simple(status, allow, now, &head, !head.keep_alive);
                false
            }
            Route::Options { allow } => {
                self.write_simple(204, Some(allow), now, &head, !head.keep_alive);
                false
            }
            Route::Card { head_only } => {
                self.answer_card(inst, &head, head_only, now);
                false
            }
            Route::Rpc => self.answer_rpc(inst, head, body, now),
            Route::Health { ready, head_only } => {
                let why = if ready {
                    crate::metrics::not_ready(inst)
                } else {
                    None
                };
                let (status, text) = match why {
                    None if ready => (200, Cow::Borrowed("ready\n")),
                    None => (200, Cow::Borrowed("ok\n")),
                    Some(why) => (503, Cow::Owned(format!("not ready: {why}\n"))),
                };
                self.write_text(status, text.as_bytes(), &head, head_only, now);
                false
            }
            Route::Metrics { head_only } => {
                self.answer_metrics(inst, &head, head_only, now);
                false
            }
            Route::Static { file, head_only } => {
                self.answer_static(file, &head, head_only, now);
                false
            }
            Route::OAuth(endpoint) => {
                let mut hold = None;
                let start = self.out.len();
                let a = if body.len() > crate::oauth::MAX_FORM_BYTES {
                    crate::oauth::Answer {
                        status: 413,
                        content_type: "application/json",
                        body: br#"{"error":"invalid_request"}"#.to_vec(),
                        retry_after_s: None,
                    }
                } else {
                    let form = head.header("content-type").is_some_and(|ct| {
                        let media = ct.split(|b| *b == b';').next().unwrap_or_default();
                        media
                            .trim_ascii()
                            .eq_ignore_ascii_case(b"application/x-www-form-urlencoded")
                    });
                    let before = inst.record_seq();
                    let a = crate::oauth::answer(
                        inst,
                        endpoint,
                        self.listener,
                        self.source,
                        form,
                        body,
                        now,
                    );
                    inst.announce_records();
                    if inst.record_seq() > before {
                        // A token issued or revoked: its answer waits for the session record.
                        hold = Some(inst.record_seq());
                    }
                    a
                };
                let date = self.date(now);
                let retry_after = a.retry_after_s.map(|s| s.to_string());
                let mut h = Head::new(a.status, &date)
                    .header("content-type", a.content_type)
                    .header("cache-control", "no-store");
                if let Some(secs) = &retry_after {
                    h = h.header("retry-after", secs);
                    self.note_refusal(&head, Limiter::OAuthSource, a.retry_after_s.unwrap_or(1));
                }
                self.finish_head(&mut h, head.minor_version, head.keep_alive, now);
                h.write_full(&mut self.out, &a.body, false);
                if let Some(seq) = hold {
                    let instead = Instead::OAuth {
                        minor: head.minor_version,
                    };
                    self.hold_from(inst, start, seq, instead);
                }
                false
            }
        }
    }

    pub(super) fn answer_rpc(
        &mut self,
        inst: &mut Instance,
        head: RequestHead,
        body: &[u8],
        now: Now,
    ) -> bool {
        let Some((principal, via, sid)) = self.authenticate(inst, &head, now) else {
            return false;
        };
        let (trace, span) = inst.request_trace(crate::trace::TraceContext::of_head(&head));
        let ctx = CallContext {
            principal: &principal,
            via,
            listener: self.listener,
            head: &head,
            now,
            sid: sid.as_deref(),
            trace: trace.as_ref(),
        };
        if let Some(r) = self.current.as_mut() {
            // Who asked and what, for the request log: read only for a known caller.
            r.principal = Label::new(&principal.id);
            (r.method, r.task_id) = reqlog::peek_call(body);
            if let Some(ids) = span {
                r.span = Some(ids);
                if r.trace_id.is_empty() {
                    // A trace started here: the log names it too.
                    r.trace_id = Label::new(&crate::ids::hex(&ids.trace_id));
                }
            }
        }
        let before = inst.record_seq();
        let rpc::Answer {
            id,
            route,
            activated,
            reply,
        } = rpc::call(inst, &ctx, body);
        self.m_method = match route {
            Some(crate::ext::registry::Route::Core(m)) => MethodLabel::Core(m),
            Some(crate::ext::registry::Route::Events) => MethodLabel::Events,
            None => MethodLabel::UnknownRpc,
        };
        inst.announce_records();
        // The call changed something: its answer acknowledges that, so it waits for it.
        let changed = (inst.record_seq() > before).then(|| inst.record_seq());
        let start = self.out.len();
        let keep_alive = head.keep_alive;
        let minor = head.minor_version;
        let annotate = activated.contains(crate::ext::Ext::TaskAnnotations);
        match reply {
            Reply::Task(json) => {
                if self
                    .current
                    .as_ref()
                    .is_some_and(|r| r.task_id.is_empty() && r.method == "SendMessage")
                {
                    // A send that returned at once: the task it created.
                    let task = json.task().id.clone();
                    self.note_task(&task);
                }
                // Held (below) when it acknowledges a change, so never refused for room.
                let echo = activated.echo();
                self.defer(inst, changed, id, minor, |id| {
                    Deferred::Task(TaskAnswer {
                        json,
                        id,
                        keep_alive,
                        minor,
                        echo,
                        acknowledges: changed.is_some(),
                    })
                });
                false
            }
            Reply::Result(result) => {
                if self
                    .current
                    .as_ref()
                    .is_some_and(|r| r.task_id.is_empty() && r.method == "SendMessage")
                {
                    // A send that returned at once: the task it created.
                    let task = reqlog::peek_result_task(&result);
                    self.note_task(task.as_str());
                }
                let echo = activated.echo();
                self.defer(inst, changed, id, minor, |id| Deferred::Result {
                    id,
                    result: ResultBody::Json(result),
                    keep_alive,
                    minor,
                    echo,
                    acknowledges: changed.is_some(),
                });
                false
            }
            Reply::Page(page) => {
                let echo = activated.echo();
                self.defer(inst, changed, id, minor, |id| Deferred::Result {
                    id,
                    result: ResultBody::Page(page),
                    keep_alive,
                    minor,
                    echo,
                    acknowledges: changed.is_some(),
                });
                false
            }
            Reply::Error(err) => {
                if err.kind == ErrorKind::RateLimited {
                    // Only the rate check of the call's pipeline answers RATE_LIMITED: a
                    // device session's rate, or the principal's own.
                    let limiter = if via == crate::auth::Via::Session {
                        Limiter::DeviceGrantRate
                    } else {
                        Limiter::PrincipalRate
                    };
                    self.note_refusal(&head, limiter, err.retry_after().unwrap_or(1));
                    if let Some(r) = self.current.as_mut() {
                        if r.principal.is_empty() {
                            // Recorded only because it was refused.
                            r.principal = Label::new(&principal.id);
                            r.method = reqlog::peek_call(body).0;
                        }
                    }
                }
                if let Some((_, task)) = err.metadata.iter().find(|(k, _)| *k == "taskId") {
                    self.note_task(task);
                }
                // A refused request echoes nothing.
                self.defer(inst, changed, id, minor, |id| Deferred::Error {
                    err: Box::new(err),
                    id,
                    keep_alive,
                    minor,
                });
                false
            }
            Reply::Wait {
                sub,
                task_id,
                history_length,
            } => {
                self.note_task(&task_id);
                self.watch(inst, sub);
                self.state = State::Waiting {
                    sub,
                    id,
                    task_id,
                    history: history_length,
                    deadline: now.mono_ms + self.limits.request_timeout_ms,
                    keep_alive,
                    minor_version: minor,
                    annotate,
                    activated,
                };
                true
            }
            Reply::Stream {
                sub,
                task_id,
                frames,
            } => {
                if let Some(t) = &task_id {
                    self.note_task(t);
                }
                let rid = id.clone();
                self.start_stream(
                    inst, id, sub, task_id, frames, keep_alive, minor, activated, now,
                );
                // The first frame of a stream that created or changed a task.
                if let Some(seq) = changed {
                    let instead = Instead::Rpc { id: rid, minor };
                    self.hold_from(inst, start, seq, instead);
                }
                true
            }
            Reply::Feed { from_seq } => {
                self.start_feed(
                    inst, id, principal, sid, from_seq, keep_alive, minor, activated, now,
                );
                true
            }
            Reply::Call {
                call,
                streaming,
                history_length,
            } => {
                let key = self.key(inst);
                if let Some(c) = inst.call(call) {
                    c.conn = Some(key);
                }
                self.state = State::Calling {
                    call,
                    id,
                    streaming,
                    history: history_length,
                    deadline: now.mono_ms + self.limits.request_timeout_ms,
                    keep_alive,
                    minor_version: minor,
                    activated,
                    since: before,
                };
                true
            }
        }
    }

    /// Who asks: the request's principal, how it was established and its session; or, when
    /// it cannot be established, the refusal written (401, 403 or 429) and `None`. Nothing
    /// costly runs before this.
    pub(super) fn authenticate(
        &mut self,
        inst: &mut Instance,
        head: &RequestHead,
        now: Now,
    ) -> Option<(Principal, crate::auth::Via, Option<String>)> {
        let loopback = inst
            .config()
            .listeners
            .get(self.listener)
            .is_some_and(|l| l.loopback);
        let authorization = head.header("authorization");
        if let Some(source) = self.source {
            // A source over its failure limit presents no more configured credentials: they
            // are refused before they are checked. Session tokens (the store decides them,
            // and a live one is served), certificates and requests presenting nothing pass.
            let checked = authorization.is_some_and(|value| {
                inst.config().auth.has_bearer() && !crate::auth::is_session_bearer(value)
            });
            if checked {
                if let Some(wait) = inst.limits.failures.refusal(source, now.mono_ms) {
                    let secs = crate::limits::retry_after_secs(wait);
                    self.note_refusal(head, Limiter::SourceFailures, secs);
                    let err = RpcError::rate_limited(
                        format!(
                            "too many failed credentials from this address: try again in {secs} s"
                        ),
                        secs,
                    );
                    self.write_error_reply(
                        &err,
                        &RequestId::null(),
                        head.keep_alive,
                        head.minor_version,
                        now,
                    );
                    return None;
                }
            }
        }
        let resolved = crate::auth::resolve_with_sessions(
            &inst.config().auth,
            Some((&inst.sessions, now.epoch_ms)),
            &self.peer,
            loopback,
            authorization,
            head.header("origin").is_some(),
        );
        match resolved {
            Ok(found) => Some(found),
            Err(why) => {
                // A presented credential that failed, and a certificate no rule gives a role,
                // count against the source; presenting nothing (or a browser refused the
                // implicit operator) does not.
                if let (Some(source), Unauthenticated::InvalidToken | Unauthenticated::NoRole) =
                    (self.source, why)
                {
                    inst.limits.failures.count(source, now.mono_ms);
                }
                // Nothing costly runs before the caller is known: refused before the body is
                // read as JSON, so the id is null.
                self.write_unauthenticated(why, head, now);
                None
            }
        }
    }

    /// Leaves the answer to request `id` for `produce` to frame. If the call changed
    /// something (`changed`: the record sequence it reached), the answer is held until that
    /// is durable, and becomes a STORE_UNAVAILABLE refusal if it never is.
    fn defer(
        &mut self,
        inst: &mut Instance,
        changed: Option<u64>,
        id: RequestId,
        minor: u8,
        answer: impl FnOnce(RequestId) -> Deferred,
    ) {
        let start = self.out.len();
        let instead = changed.map(|seq| {
            (
                seq,
                Instead::Rpc {
                    id: id.clone(),
                    minor,
                },
            )
        });
        self.deferred = Some(answer(id));
        if let Some((seq, instead)) = instead {
            self.hold_from(inst, start, seq, instead);
        }
    }

    /// Points a subscription's wake-ups at this connection.
    pub(super) fn watch(&mut self, inst: &mut Instance, sub: SubId) {
        let key = self.key(inst);
        if let Some(s) = inst.subscription(sub) {
            s.conn = Some(key);
        }
    }

    /// This connection's key in the instance's registry of wakers, registered the first
    /// time it waits on anything there.
    pub(super) fn key(&mut self, inst: &mut Instance) -> ConnKey {
        *self
            .key
            .get_or_insert_with(|| inst.register_conn(&self.waker))
    }

    /// `/metrics`, the operator's: what it reads of the instance is taken here, under the
    /// instance; `produce` renders it with the core's counters and the host's sources.
    fn answer_metrics(
        &mut self,
        inst: &mut Instance,
        head: &RequestHead,
        head_only: bool,
        now: Now,
    ) {
        let Some((principal, _, _)) = self.authenticate(inst, head, now) else {
            return;
        };
        if !principal.is_operator() {
            self.note_error(ErrorKind::PermissionDenied);
            let text = b"the metrics are the operator's: present the operator's credential\n";
            self.write_text(403, text, head, head_only, now);
            return;
        }
        self.deferred = Some(Deferred::Metrics {
            metrics: inst.metrics.clone(),
            figures: Box::new(InstanceFigures::of(inst, now)),
            sources: Sources(inst.metric_sources.clone()),
            head_only,
            keep_alive: head.keep_alive,
            minor: head.minor_version,
        });
    }

    /// A short plain-text answer that is never cached (probes, refusals of `/metrics`).
    pub(super) fn write_text(
        &mut self,
        status: u16,
        text: &[u8],
        head: &RequestHead,
        head_only: bool,
        now: Now,
    ) {
        let date = self.date(now);
        let mut h = Head::new(status, &date)
            .header("content-type", "text/plain; charset=utf-8")
            .header("cache-control", "no-store");
        self.finish_head(&mut h, head.minor_version, head.keep_alive, now);
        h.write_full(&mut self.out, text, head_only);
    }

    /// A file the host compiled in: never sniffed, never framed, its script and style its
    /// own origin's only; revalidated by its entity tag (`no-cache`), so a new build is seen
    /// at once and an unchanged file costs a 304.
    pub(super) fn answer_static(
        &mut self,
        file: &'static crate::statics::StaticFile,
        head: &RequestHead,
        head_only: bool,
        now: Now,
    ) {
        let etag = file.etag();
        let fresh = head
            .header_all("if-none-match")
            .any(|v| etag_matches(v, &etag));
        let date = self.date(now);
        let mut h = Head::new(if fresh { 304 } else { 200 }, &date)
            .header("content-type", file.content_type)
            .header("cache-control", "no-cache")
            .header("etag", etag)
            .header("content-security-policy", crate::statics::CONSOLE_CSP)
            .header("x-content-type-options", "nosniff")
            .header("x-frame-options", "DENY")
            .header("referrer-policy", "no-referrer");
        self.finish_head(&mut h, head.minor_version, head.keep_alive, now);
        h.write_full(&mut self.out, file.body, head_only);
    }

    /// The card: taken (shared) under the instance, copied out by `produce`.
    pub(super) fn answer_card(
        &mut self,
        inst: &Instance,
        head: &RequestHead,
        head_only: bool,
        now: Now,
    ) {
        let Some(card) = inst.card(self.listener) else {
            self.write_simple(404, None, now, head, !head.keep_alive);
            return;
        };
        let fresh = head
            .header_all("if-none-match")
            .any(|v| etag_matches(v, &card.etag));
        self.deferred = Some(Deferred::Card {
            card: card.clone(),
            fresh,
            head_only,
            keep_alive: head.keep_alive,
            minor: head.minor_version,
        });
    }

    /// 401: who the caller is could not be established. The challenge says which scheme.
    pub(super) fn write_unauthenticated(
        &mut self,
        why: Unauthenticated,
        head: &RequestHead,
        now: Now,
    ) {
        self.note_error(if why == Unauthenticated::NoRole {
            ErrorKind::PermissionDenied
        } else {
            ErrorKind::Unauthenticated
        });
        if why == Unauthenticated::NoRole {
            // Who it is is known; it simply may do nothing here.
            let err = RpcError::new(
                ErrorKind::PermissionDenied,
                "no rule gives this client certificate a role",
            );
            let mut doc = Vec::with_capacity(192);
            jsonrpc::write_error(&mut doc, &RequestId::null(), &err);
            self.write_json_keep(403, &doc, head.keep_alive, head.minor_version, None, now);
            return;
        }
        let (challenge, message) = match why {
            Unauthenticated::NoRole => unreachable!("answered above"),
            Unauthenticated::Missing => (
                "Bearer realm=\"agentd\"",
                "authentication required: present a bearer token",
            ),
            Unauthenticated::InvalidToken => (
                "Bearer realm=\"agentd\", error=\"invalid_token\"",
                "the presented credential is not valid here",
            ),
            Unauthenticated::Browser => (
                "Bearer realm=\"agentd\"",
                "browser requests must authenticate: a request with Origin is never the implicit operator",
            ),
        };
        let err = RpcError::new(ErrorKind::Unauthenticated, message);
        let mut doc = Vec::with_capacity(192);
        jsonrpc::write_error(&mut doc, &RequestId::null(), &err);
        let date = self.date(now);
        let mut h = Head::new(401, &date)
            .header("content-type", "application/json")
            .header("www-authenticate", challenge);
        self.finish_head(&mut h, head.minor_version, head.keep_alive, now);
        h.write_full(&mut self.out, &doc, false);
    }
}
