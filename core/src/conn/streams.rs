//! What a connection answers over time, under the instance: SSE streams of a task's events,
//! the events feed, a blocking send waiting for its task to settle, and a command waiting
//! for its host's answer.

use super::*;

impl Connection {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_stream(
        &mut self,
        inst: &mut Instance,
        id: RequestId,
        sub: Option<SubId>,
        task_id: Option<String>,
        frames: Vec<(u64, Arc<StreamResponse>)>,
        keep_alive: bool,
        minor: u8,
        activated: ExtSet,
        now: Now,
    ) {
        if let Some(sub) = sub {
            self.watch(inst, sub);
        }
        let chunked = self.write_stream_head(minor, keep_alive, activated, now);
        self.frames_for = (id.clone(), chunked);
        self.state = State::Streaming {
            sub,
            task_id,
            pending: frames.into(),
            id,
            chunked,
            keep_alive: keep_alive && chunked,
            last_write: now.mono_ms,
        };
        // As much as the output bound allows now; the rest as the peer reads.
        self.pump_stream(inst, now);
    }

    /// The head of an SSE answer: the echo, CORS, and chunked transfer (HTTP/1.0 has no
    /// chunked coding: its stream ends when the connection does). Returns whether chunked.
    pub(super) fn write_stream_head(
        &mut self,
        minor: u8,
        keep_alive: bool,
        activated: ExtSet,
        now: Now,
    ) -> bool {
        let chunked = minor >= 1;
        let date = self.date(now);
        let mut h = Head::new(200, &date);
        if let Some(echo) = activated.echo() {
            h = h.header("a2a-extensions", echo);
        }
        h.close = !chunked || !keep_alive;
        self.cors_headers(&mut h);
        if let Some(hsts) = &self.hsts {
            h.headers.push(("strict-transport-security", hsts.clone()));
        }
        h.write_sse_start(&mut self.out, chunked);
        self.stream_started(now);
        chunked
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_feed(
        &mut self,
        inst: &mut Instance,
        id: RequestId,
        principal: Principal,
        sid: Option<String>,
        from_seq: u64,
        keep_alive: bool,
        minor: u8,
        activated: ExtSet,
        now: Now,
    ) {
        let (newest, resync, start) = match inst.feed() {
            Some(ring) => {
                let resync = ring.needs_resync(from_seq);
                // The replay starts at the ring's start with resync, or when the cursor
                // (0: "from the start") is older than anything the ring still holds.
                let ring_start = ring.oldest() - 1;
                let start = if resync {
                    ring_start
                } else {
                    from_seq.max(ring_start)
                };
                (ring.newest(), resync, start)
            }
            None => (0, from_seq > 0, 0),
        };
        let watcher = self.key(inst);
        inst.watch_feed(watcher);
        let chunked = self.write_stream_head(minor, keep_alive, activated, now);
        let hello = crate::feed::hello(
            newest,
            from_seq,
            resync,
            inst.config().introspection_enabled,
            &inst.config().version,
        );
        let mut doc = Vec::with_capacity(160);
        jsonrpc::write_result(&mut doc, &id, &serde_json::json!({ "hello": hello }));
        response::write_sse_event(&mut self.out, &doc, chunked);
        self.frames_for = (id.clone(), chunked);
        self.state = State::Feed {
            watcher,
            principal,
            sid,
            id,
            cursor: start,
            chunked,
            keep_alive: keep_alive && chunked,
            deadline: now.mono_ms + inst.config().events_stream_deadline_ms,
            annotate: activated.contains(crate::ext::Ext::TaskAnnotations),
            last_write: now.mono_ms,
            last_batch: None,
            linger: None,
            more: true,
        };
    }

    /// Takes feed events past the cursor that this caller may see, for `produce` to write.
    /// True when the stream ended (the subscriber fell out of the ring, or its session was
    /// revoked).
    ///
    /// Under a steady flow of events a subscriber takes them in batches: at most once per
    /// `events_batch_ms`, or as soon as [`FEED_BATCH`] wait, so that each wake-up and each
    /// write carries many frames instead of one (an event after a quiet spell goes at once).
    /// The instance wakes a feed connection only when its next event, or its batch, is
    /// there ([`Instance::arm_feed`]), not at every event.
    pub(super) fn pump_feed(&mut self, inst: &mut Instance, now: Now) -> bool {
        let State::Feed {
            watcher,
            ref principal,
            ref sid,
            ref mut cursor,
            annotate,
            ref mut last_write,
            ref mut last_batch,
            ref mut linger,
            ref mut more,
            ..
        } = self.state
        else {
            return false;
        };
        if let Some(sid) = sid {
            if !inst.session_live(sid, now) {
                // Within one tick of the revocation, and nothing past it.
                self.end_feed(inst, Some(crate::feed::Goodbye::Revoked), now);
                return true;
            }
        }
        let batch_ms = inst.config().events_batch_ms;
        let Some(ring) = inst.feed.as_ref() else {
            return false;
        };
        if ring.overran(*cursor) {
            // Too slow: the events it needs are gone. End the stream without goodbye; its
            // reconnect from the same cursor is answered with resync.
            self.end_feed(inst, None, now);
            return true;
        }
        let waiting = ring.newest().saturating_sub(*cursor);
        // Not while catching up: the rest of a batch taken in parts goes on at once.
        let paced = !*more && last_batch.is_some_and(|t| now.mono_ms < t.saturating_add(batch_ms));
        if waiting > 0 && waiting < FEED_BATCH && paced {
            // Too soon after the last batch: wait for more, until the deadline or a batch.
            let due = last_batch.unwrap_or_default().saturating_add(batch_ms);
            *linger = Some(due);
            *more = false;
            let wake_at = cursor.saturating_add(FEED_BATCH);
            inst.arm_feed(watcher, wake_at);
            return false;
        }
        *linger = None;
        let mut took = false;
        // Bounded by the output backlog and the frames ahead of it: the driver writes them
        // (produce frames them, outside the instance), then polls again.
        let backlog = self.out.len() - self.out_pos;
        let mut bounded = false;
        for e in ring.after(*cursor) {
            if backlog >= self.limits.max_output_bytes || self.frames.len() >= FEED_FRAMES_AHEAD {
                bounded = true;
                break;
            }
            *cursor = e.seq;
            if !e.visible_to(principal) {
                continue;
            }
            self.frames
                .push_back(Frame::Feed(e.frame_for(annotate).clone()));
            took = true;
        }
        *more = bounded;
        if took {
            *last_write = now.mono_ms;
            *last_batch = Some(now.mono_ms);
        } else if !paced {
            // Quiet: the next event goes out at once.
            *last_batch = None;
        }
        if !bounded {
            // Caught up: woken by the next event.
            let next = cursor.saturating_add(1);
            inst.arm_feed(watcher, next);
        }
        false
    }

    /// Ends the feed stream, with `goodbye` when it has a reason to give.
    pub(super) fn end_feed(
        &mut self,
        inst: &mut Instance,
        goodbye: Option<crate::feed::Goodbye>,
        now: Now,
    ) {
        let State::Feed {
            watcher,
            ref id,
            cursor,
            chunked,
            keep_alive,
            ..
        } = self.state
        else {
            return;
        };
        // After the frames still waiting to be written.
        let mut end = Vec::new();
        if let Some(reason) = goodbye {
            let mut doc = Vec::with_capacity(96);
            let frame = serde_json::json!({"goodbye": {"reason": reason.as_str(), "seq": cursor}});
            jsonrpc::write_result(&mut doc, id, &frame);
            response::write_sse_event(&mut end, &doc, chunked);
        }
        if chunked {
            response::write_chunked_end(&mut end);
        }
        if !end.is_empty() {
            self.frames.push_back(Frame::Framed(end));
        }
        inst.unwatch_feed(watcher);
        self.state = State::Reading { pending: None };
        if !keep_alive {
            self.closing = true;
        }
        self.stream_ended(now);
    }

    /// A command handed to the host: answers once the host does. True when it did.
    pub(super) fn pump_call(&mut self, inst: &mut Instance, now: Now) -> bool {
        let State::Calling {
            call,
            ref id,
            streaming,
            history,
            keep_alive,
            minor_version,
            activated,
            since,
            ..
        } = self.state
        else {
            return false;
        };
        if inst.call(call).is_some_and(|c| c.outcome.is_none()) {
            return false;
        }
        let id = id.clone();
        let annotate = activated.contains(crate::ext::Ext::TaskAnnotations);
        self.state = State::Reading { pending: None };
        // Whatever the host changed for this call (a task started, state it changed) is
        // acknowledged by the answer: it waits for those records.
        let start = self.out.len();
        let seq = inst.record_seq();
        let changed = seq > since;
        let instead = Instead::Rpc {
            id: id.clone(),
            minor: minor_version,
        };
        self.pump_call_answer(
            inst,
            call,
            id,
            streaming,
            history,
            keep_alive,
            minor_version,
            activated,
            annotate,
            now,
        );
        if changed {
            self.hold_from(inst, start, seq, instead);
        }
        true
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn pump_call_answer(
        &mut self,
        inst: &mut Instance,
        call: CallId,
        id: RequestId,
        streaming: bool,
        history: Option<usize>,
        keep_alive: bool,
        minor_version: u8,
        activated: ExtSet,
        annotate: bool,
        now: Now,
    ) {
        let Some(pending) = inst.end_call(call) else {
            let err = RpcError::new(ErrorKind::Internal, "the command call was lost");
            self.note_error(err.kind);
            let mut doc = Vec::new();
            jsonrpc::write_error(&mut doc, &id, &err);
            self.write_json_keep(200, &doc, keep_alive, minor_version, None, now);
            return;
        };
        match pending.outcome {
            None => unreachable!("checked above"),
            Some(CallOutcome::Answered(CommandAnswer::Refused(err))) => {
                self.write_error_reply(&err, &id, keep_alive, minor_version, now);
            }
            Some(CallOutcome::Answered(CommandAnswer::Document(result))) => {
                let message = crate::ext::command::reply_message(
                    format!("msg-{}", inst.new_id()),
                    pending.context.name,
                    result,
                );
                let response = StreamResponse::Message(message);
                if streaming {
                    self.start_stream(
                        inst,
                        id,
                        None,
                        None,
                        vec![(0, Arc::new(response))],
                        keep_alive,
                        minor_version,
                        activated,
                        now,
                    );
                } else {
                    let mut doc = Vec::with_capacity(256);
                    jsonrpc::write_result(&mut doc, &id, &response);
                    self.write_json_keep(
                        200,
                        &doc,
                        keep_alive,
                        minor_version,
                        activated.echo(),
                        now,
                    );
                }
            }
            Some(CallOutcome::Started {
                task_id,
                sub,
                first,
                first_seq,
            }) => {
                self.note_task(&task_id);
                match sub {
                    Some(sub) if streaming => {
                        self.start_stream(
                            inst,
                            id,
                            Some(sub),
                            Some(task_id),
                            vec![(first_seq, Arc::new(StreamResponse::Task(*first)))],
                            keep_alive,
                            minor_version,
                            activated,
                            now,
                        );
                    }
                    Some(sub) => {
                        self.watch(inst, sub);
                        self.state = State::Waiting {
                            sub,
                            id,
                            task_id,
                            history,
                            deadline: now.mono_ms + self.limits.request_timeout_ms,
                            keep_alive,
                            minor_version,
                            annotate,
                            activated,
                        };
                    }
                    None => {
                        let mut doc = Vec::with_capacity(512);
                        jsonrpc::write_result(&mut doc, &id, &StreamResponse::Task(*first));
                        self.write_json_keep(
                            200,
                            &doc,
                            keep_alive,
                            minor_version,
                            activated.echo(),
                            now,
                        );
                    }
                }
            }
        }
    }

    /// A blocking send: answers once the task settles. True when it did.
    pub(super) fn pump_wait(&mut self, inst: &mut Instance, now: Now) -> bool {
        let State::Waiting { sub, .. } = self.state else {
            return false;
        };
        match inst.subscription(sub) {
            Some(s) if !s.settled => false,
            _ => {
                self.finish_wait(inst, now);
                true
            }
        }
    }

    pub(super) fn finish_wait(&mut self, inst: &mut Instance, now: Now) {
        let State::Waiting {
            sub,
            ref id,
            ref task_id,
            history,
            keep_alive,
            minor_version,
            annotate,
            activated,
            ..
        } = self.state
        else {
            return;
        };
        let id = id.clone();
        inst.unsubscribe(sub);
        let task_id = task_id.clone();
        let json = inst.tasks.get(&task_id).map(|t| {
            let task = t.view(history, true, annotate);
            TaskJson::new(
                task,
                b"{\"task\":".to_vec(),
                b"}".to_vec(),
                t.answer_weight(),
            )
        });
        self.state = State::Reading { pending: None };
        let start = self.out.len();
        match json {
            Some(json) => {
                self.deferred = Some(Deferred::Task(TaskAnswer {
                    json: Box::new(json),
                    id: id.clone(),
                    keep_alive,
                    minor: minor_version,
                    echo: activated.echo(),
                    acknowledges: true,
                }));
            }
            None => {
                let mut doc = Vec::with_capacity(256);
                jsonrpc::write_error(&mut doc, &id, &RpcError::task_not_found(&task_id));
                if let Some(r) = self.current.as_mut() {
                    r.error = Some(ErrorKind::TaskNotFound);
                }
                self.write_json_keep(200, &doc, keep_alive, minor_version, None, now);
            }
        }
        // The answer of a blocking send acknowledges the task and the state it reached.
        let seq = inst.record_seq();
        let minor = minor_version;
        self.hold_from(inst, start, seq, Instead::Rpc { id, minor });
    }

    /// Takes the answer's own frames, then queued stream events, for `produce` to write.
    /// True when the stream ended.
    pub(super) fn pump_stream(&mut self, inst: &mut Instance, now: Now) -> bool {
        let State::Streaming { sub, .. } = self.state else {
            return false;
        };
        loop {
            if self.backlog() >= self.limits.max_output_bytes || self.frames.len() >= FRAMES_AHEAD {
                return false;
            }
            let State::Streaming {
                ref mut pending, ..
            } = self.state
            else {
                return true;
            };
            let own = pending.front().cloned();
            let from_answer = own.is_some();
            let next = match own {
                Some(next) => next,
                None => {
                    // Without a subscription the answer's frames were the whole stream (they
                    // end at a terminal state anyway: a finished task's last event is its
                    // terminal status).
                    let Some(s) = sub.and_then(|sub| inst.subscription(sub)) else {
                        self.end_stream(inst, None, now);
                        return true;
                    };
                    match s.queue.front() {
                        Some(next) => next.clone(),
                        None if s.overflowed => {
                            let err = RpcError::new(
                                ErrorKind::Internal,
                                "this stream fell too far behind its task and was ended; call SubscribeToTask to resume",
                            );
                            self.end_stream(inst, Some(err), now);
                            return true;
                        }
                        None => return false,
                    }
                }
            };
            let held = self.holds_until_durable(inst, &next.1);
            if held && (self.tail.is_some() || !self.frames.is_empty()) {
                // A held frame is written in place, under the instance: after what is
                // queued ahead of it, at the next poll.
                return false;
            }
            match self.state {
                State::Streaming {
                    ref mut pending, ..
                } if from_answer => {
                    pending.pop_front();
                }
                _ => {
                    if let Some(s) = sub.and_then(|sub| inst.subscription(sub)) {
                        s.queue.pop_front();
                    }
                }
            }
            if self.write_stream_event(inst, next.0, next.1, held, now) {
                return true;
            }
        }
    }

    /// A stream event that settles its task is not shown before the change is durable:
    /// its frame is held until it is.
    fn holds_until_durable(&self, inst: &Instance, event: &StreamResponse) -> bool {
        matches!(event, StreamResponse::StatusUpdate(u) if u.status.state.ends_a_turn())
            && inst.must_hold(inst.record_seq())
    }

    /// Takes one stream event, `seq` its number in the task's sequence (the SSE id of a
    /// task stream's frame): queued for `produce`, or, when `held`, written here and held
    /// until durable (nothing is queued ahead of it then). Ends the stream after a terminal
    /// or interrupted status. True when the stream ended.
    pub(super) fn write_stream_event(
        &mut self,
        inst: &mut Instance,
        seq: u64,
        event: Arc<StreamResponse>,
        held: bool,
        now: Now,
    ) -> bool {
        let State::Streaming {
            ref id,
            ref task_id,
            chunked,
            ref mut last_write,
            ..
        } = self.state
        else {
            return false;
        };
        *last_write = now.mono_ms;
        let event_id = task_id.as_deref().map(|t| inst.stream_event_id(t, seq));
        let ends = match &*event {
            StreamResponse::StatusUpdate(u) => u.status.state.ends_a_turn(),
            StreamResponse::Task(t) => t.status.state.is_terminal(),
            StreamResponse::Message(_) => true,
            StreamResponse::ArtifactUpdate(_) => false,
        };
        if held {
            // A settled state is never shown before it is durable; earlier frames may be.
            let rid = id.clone();
            let start = self.out.len();
            let mut doc = Vec::with_capacity(512);
            jsonrpc::write_result(&mut doc, &rid, &*event);
            response::write_sse_event_with_id(&mut self.out, event_id.as_deref(), &doc, chunked);
            let seq = inst.record_seq();
            let instead = Instead::StreamFrame { id: rid, chunked };
            self.hold_from(inst, start, seq, instead);
        } else {
            self.frames.push_back(Frame::Event { event_id, event });
        }
        if ends {
            self.end_stream(inst, None, now);
        }
        ends
    }

    pub(super) fn end_stream(&mut self, inst: &mut Instance, error: Option<RpcError>, now: Now) {
        let State::Streaming {
            sub,
            ref id,
            chunked,
            keep_alive,
            ..
        } = self.state
        else {
            return;
        };
        // After the frames still waiting to be written.
        let mut end = Vec::new();
        if let Some(err) = error {
            let mut doc = Vec::with_capacity(256);
            jsonrpc::write_error(&mut doc, id, &err);
            response::write_sse_event(&mut end, &doc, chunked);
            self.note_error(err.kind);
        }
        if chunked {
            response::write_chunked_end(&mut end);
        }
        if !end.is_empty() {
            self.frames.push_back(Frame::Framed(end));
        }
        if let Some(sub) = sub {
            inst.unsubscribe(sub);
        }
        self.state = State::Reading { pending: None };
        if !keep_alive {
            self.closing = true;
        }
        self.stream_ended(now);
    }
}
