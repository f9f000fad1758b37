//! The half of a connection that takes no instance: bytes in (TLS, and the HTTP parser
//! reading the next request ahead), the answer [`Connection::serve`] decided framed, a large
//! answer written in slices as room frees, held output kept back, bytes out. A driver that
//! shares the instance behind a lock runs all of this outside it.

use super::*;

impl Connection {
    /// Whether a read answer of `len` bytes may be written now. An answer within the output
    /// bound always may; a larger one (a large task) takes its bytes from the instance's
    /// pool until the peer reads them, and is refused while the pool is spent (but one is
    /// always admitted into an empty pool). A small request cannot otherwise make the
    /// daemon hold megabytes for a reader that does not read.
    pub(super) fn admit_large(&mut self, len: usize) -> bool {
        use std::sync::atomic::Ordering;
        if len <= self.limits.max_output_bytes {
            return true;
        }
        let Some(pool) = self.large_pool.as_ref() else {
            // Never prepared, so never served: nothing to answer.
            return false;
        };
        let cap = self.limits.large_answers_bytes;
        let admitted = pool
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held == 0 || held.saturating_add(len) <= cap).then(|| held + len)
            })
            .is_ok();
        if admitted {
            self.large_held += len;
        }
        admitted
    }

    /// The peer read `n` bytes (or they were dropped): as many large-answer bytes go back
    /// to the pool.
    pub(super) fn release_large(&mut self, n: usize) {
        let r = n.min(self.large_held);
        if r > 0 {
            self.large_held -= r;
            if let Some(pool) = &self.large_pool {
                pool.fetch_sub(r, std::sync::atomic::Ordering::AcqRel);
            }
        }
    }

    /// Writes more of a large answer while the output has room.
    pub(super) fn pump_tail(&mut self) {
        let bound = self.limits.max_output_bytes;
        while let Some(tail) = self.tail.as_mut() {
            let room = bound.saturating_sub(
                self.out.len() - self.out_pos + self.tls.as_ref().map_or(0, |t| t.pending().len()),
            );
            if room == 0 {
                return;
            }
            let done = if tail.chunked {
                let mut slice = Vec::with_capacity(room.min(64 * 1024) + 8);
                let done = tail.json.fill(&mut slice, room);
                if !slice.is_empty() {
                    use std::io::Write;
                    let _ = write!(self.out, "{:x}\r\n", slice.len());
                    self.out.extend_from_slice(&slice);
                    self.out.extend_from_slice(b"\r\n");
                }
                done
            } else {
                tail.json.fill(&mut self.out, room)
            };
            if done {
                self.tail = None;
                // A head buffered behind the answer starts its clock now.
                self.head_started = None;
                // What waited behind it (pipelined requests, a stream's next events) goes
                // on at the next poll.
                self.waker.wake_by_ref();
            }
        }
    }

    /// Writes what waits to be written while the output has room: the rest of a large
    /// answer, then the stream and feed frames [`Connection::serve`] took from the instance,
    /// in order (a task snapshot among them becomes the large answer being written).
    pub(super) fn pump_output(&mut self) {
        loop {
            self.pump_tail();
            if self.tail.is_some() || self.backlog() >= self.limits.max_output_bytes {
                return;
            }
            let Some(frame) = self.frames.pop_front() else {
                if self.frames.capacity() > 2 * FRAMES_AHEAD {
                    // A feed's large batch keeps no room between batches.
                    self.frames = VecDeque::new();
                }
                return;
            };
            self.write_frame(frame);
        }
    }

    fn write_frame(&mut self, frame: Frame) {
        let (id, chunked) = (&self.frames_for.0, self.frames_for.1);
        match frame {
            Frame::Event { event_id, event } => {
                if let StreamResponse::Task(task) = &*event {
                    // A task snapshot may be megabytes: written as the peer reads it, in as
                    // many chunks as the output's room makes.
                    let mut prefix = Vec::with_capacity(96);
                    if let Some(eid) = &event_id {
                        prefix.extend_from_slice(b"id: ");
                        prefix.extend_from_slice(eid.as_bytes());
                        prefix.push(b'\n');
                    }
                    prefix.extend_from_slice(b"data: {\"id\":");
                    prefix.extend_from_slice(id.as_json().as_bytes());
                    prefix.extend_from_slice(b",\"jsonrpc\":\"2.0\",\"result\":{\"task\":");
                    let json = TaskJson::new(task.clone(), prefix, b"}}\n\n".to_vec(), 0);
                    self.tail = Some(Tail {
                        json: Box::new(json),
                        chunked,
                    });
                } else {
                    let mut doc = Vec::with_capacity(512);
                    jsonrpc::write_result(&mut doc, id, &*event);
                    response::write_sse_event_with_id(
                        &mut self.out,
                        event_id.as_deref(),
                        &doc,
                        chunked,
                    );
                }
            }
            Frame::Feed(frame) => response::write_sse_shared(
                &mut self.out,
                [crate::feed::FRAME_HEAD, id.as_json().as_bytes(), &frame],
                chunked,
            ),
            Frame::Framed(bytes) => self.out.extend_from_slice(&bytes),
        }
    }

    /// The end of what may be written: the start of the first hold.
    pub(super) fn visible_end(&self) -> usize {
        self.holds.front().map_or(self.out.len(), |h| h.start)
    }

    /// The output buffer lost its first `n` bytes.
    pub(super) fn shift_holds(&mut self, n: usize) {
        for h in self.holds.iter_mut() {
            h.start = h.start.saturating_sub(n);
        }
    }

    /// Bytes read from the peer, taken without the instance: a TLS session decrypts them
    /// here (the handshake runs here, and what it answers is ready to write at once) and the
    /// plaintext waits for [`Connection::poll`], which answers it. A driver that shares the
    /// instance behind a lock calls this outside the lock. True when `poll` has something to
    /// do (plaintext arrived, or the peer closed); a handshake in progress needs no poll.
    pub fn receive(&mut self, bytes: &[u8], now: Now) -> bool {
        self.last_mono = now.mono_ms;
        if self.closing || self.aborted || bytes.is_empty() {
            return false;
        }
        if !self.tls_checked {
            // Not prepared: whether these bytes are TLS is decided at the next poll.
            self.unprepared.extend_from_slice(bytes);
            return true;
        }
        let serve = self.take_input(bytes, now);
        self.read_ahead();
        serve
    }

    /// Parses the next request out of the input, outside the instance, unless one is
    /// parsed already: its head (so its route can be decided before its body arrives), and
    /// its body once whole.
    pub(super) fn read_ahead(&mut self) {
        while !self.closing && !matches!(self.ahead.back(), Some(Ok(Event::Body(_)) | Err(_))) {
            match self.parser.next_event() {
                Ok(Some(event)) => self.ahead.push_back(Ok(event)),
                Ok(None) => return,
                Err(e) => self.ahead.push_back(Err(e)),
            }
        }
    }

    /// Bytes of the request parsed ahead.
    pub(super) fn ahead_bytes(&self) -> usize {
        self.ahead
            .iter()
            .map(|e| match e {
                Ok(Event::Body(b)) => b.len(),
                _ => 0,
            })
            .sum()
    }

    /// Decrypts (with TLS) and buffers `bytes`; true when there is plaintext or an end of
    /// input to act on.
    pub(super) fn take_input(&mut self, bytes: &[u8], now: Now) -> bool {
        let Some(tls) = self.tls.as_mut() else {
            self.parser.push(bytes);
            return true;
        };
        let mut plain = Vec::new();
        let was_handshaking = tls.handshaking();
        match tls.receive(bytes, &mut plain, now) {
            Ok(peer_closed) => {
                if was_handshaking && !tls.handshaking() {
                    // The handshake's clock stops here, though no poll may follow: the
                    // request head's starts with its first bytes.
                    self.head_started = None;
                }
                if !tls.handshaking() && matches!(self.peer, Peer::Tcp) {
                    if let Some(id) = tls.client_identity() {
                        self.peer = Peer::Cert(id);
                    }
                }
                self.parser.push(&plain);
                self.peer_closed |= peer_closed;
                !plain.is_empty() || peer_closed
            }
            Err(()) => {
                // A failed handshake or a corrupt record: its alert goes out, then close.
                self.closing = true;
                false
            }
        }
    }

    /// Moves written plaintext through the TLS session (a no-op without TLS).
    pub(super) fn encrypt(&mut self) {
        let Some(tls) = self.tls.as_mut() else { return };
        if self.closing && tls.handshaking() {
            // Nothing can be said to a peer that never finished its handshake.
            self.aborted = true;
            return;
        }
        let end = self.holds.front().map_or(self.out.len(), |h| h.start);
        let n = tls.send(&self.out[self.out_pos..end]);
        self.out_pos += n;
        if self.out_pos == self.out.len() {
            clear_output(&mut self.out, self.limits.max_output_bytes);
            self.out_pos = 0;
            // Only empty holds can remain (held bytes are never sent).
            self.holds.iter_mut().for_each(|h| h.start = 0);
            // Not before the last slice of a large answer, or a frame, still to be written.
            if self.closing && self.tail.is_none() && self.frames.is_empty() {
                tls.close_notify();
            }
        }
        self.release_large(n);
    }

    /// The half of [`Connection::poll`] that needs no instance: frames the answer
    /// [`Connection::serve`] decided (a task serialized, a card or a result copied), writes
    /// more of a large answer, and encrypts. True when `serve` has more to do (a request
    /// read behind the answer just framed): call it again.
    pub fn produce(&mut self, now: Now) -> bool {
        self.last_mono = now.mono_ms;
        let framed = self.frame_deferred(now) || !self.frames.is_empty();
        self.pump_output();
        self.encrypt();
        self.note_output(now);
        if !framed || self.closing || self.answering() {
            return false;
        }
        self.read_ahead();
        !self.ahead.is_empty() || self.parser.buffered() > 0
    }

    /// Bytes to write to the peer.
    pub fn pending_output(&self) -> &[u8] {
        if self.aborted {
            return &[];
        }
        match &self.tls {
            Some(tls) => tls.pending(),
            None => &self.out[self.out_pos..self.visible_end()],
        }
    }

    /// `n` bytes of [`Connection::pending_output`] were written.
    pub fn consume_output(&mut self, n: usize, now: Now) {
        self.last_mono = now.mono_ms;
        if let Some(tls) = self.tls.as_mut() {
            tls.consume(n);
            self.write_stalled_since = (!tls.pending().is_empty()).then_some(now.mono_ms);
            self.pump_output();
            self.encrypt();
            return;
        }
        let before = self.out_pos;
        self.out_pos = (self.out_pos + n).min(self.visible_end());
        self.release_large(self.out_pos - before);
        if self.out_pos == self.out.len() {
            clear_output(&mut self.out, self.limits.max_output_bytes);
            self.out_pos = 0;
            self.holds.iter_mut().for_each(|h| h.start = 0);
            self.write_stalled_since = None;
        } else if self.out_pos == self.visible_end() {
            // What remains is held, not stalled.
            self.write_stalled_since = None;
        } else if n > 0 {
            self.write_stalled_since = Some(now.mono_ms);
        }
        if self.out_pos > 64 * 1024 {
            self.out.drain(..self.out_pos);
            let n = self.out_pos;
            self.shift_holds(n);
            self.out_pos = 0;
            // What is left of a large answer keeps no more room than it needs.
            let bound = 2 * self.limits.max_output_bytes;
            if self.out.capacity() > bound && self.out.len() < self.out.capacity() / 2 {
                self.out.shrink_to(self.out.len().max(bound));
            }
        }
        if self.tail.is_some() || !self.frames.is_empty() {
            self.pump_output();
            if self.write_stalled_since.is_none() && self.visible_end() > self.out_pos {
                self.write_stalled_since = Some(now.mono_ms);
            }
        }
    }

    pub(super) fn backlog(&self) -> usize {
        self.out.len() - self.out_pos + self.tls.as_ref().map_or(0, |t| t.pending().len())
    }

    pub(super) fn note_output(&mut self, now: Now) {
        let writable = self.visible_end() > self.out_pos
            || self.tls.as_ref().is_some_and(|t| !t.pending().is_empty());
        if self.write_stalled_since.is_none() && writable {
            self.write_stalled_since = Some(now.mono_ms);
        }
    }

    pub(super) fn date(&mut self, now: Now) -> String {
        let sec = now.epoch_ms / 1000;
        if self.date.0 != sec {
            self.date = (sec, http_date(now.epoch_ms));
        }
        self.date.1.clone()
    }

    /// Frames the answer `serve` decided, if one waits. True when one did.
    pub(super) fn frame_deferred(&mut self, now: Now) -> bool {
        let Some(deferred) = self.deferred.take() else {
            return false;
        };
        match deferred {
            Deferred::Card {
                card,
                fresh,
                head_only,
                keep_alive,
                minor,
            } => {
                let date = self.date(now);
                let mut h = Head::new(if fresh { 304 } else { 200 }, &date)
                    .header("content-type", "application/json")
                    .header("etag", Cow::Borrowed(card.etag.as_str()))
                    .header("cache-control", "public, max-age=60")
                    .header("access-control-allow-origin", "*");
                self.finish_head(&mut h, minor, keep_alive, now);
                h.write_full(&mut self.out, &card.body, head_only);
            }
            Deferred::Result {
                id,
                result,
                keep_alive,
                minor,
                echo,
                acknowledges,
            } => {
                let result = match result {
                    ResultBody::Json(json) => json,
                    // A list page is serialized here, outside the instance.
                    ResultBody::Page(page) => match page.render() {
                        Ok(json) => json,
                        Err(err) => {
                            self.write_error_reply(&err, &id, keep_alive, minor, now);
                            return true;
                        }
                    },
                };
                // A read's large answer waits for room in the pool; an answer that
                // acknowledges a change is always given (its request carried the bytes).
                if !acknowledges && !self.admit_large(result.len()) {
                    let err = self.large_refusal(result.len());
                    self.write_error_reply(&err, &id, keep_alive, minor, now);
                    return true;
                }
                let mut doc = Vec::with_capacity(result.len() + 48);
                jsonrpc::write_result_raw(&mut doc, &id, &result);
                drop(result);
                self.write_json_keep(200, &doc, keep_alive, minor, echo, now);
            }
            Deferred::Task(answer) => self.write_task_result(answer, now),
            Deferred::Metrics {
                metrics,
                figures,
                sources,
                head_only,
                keep_alive,
                minor,
            } => {
                let mut w = crate::metrics::MetricsWriter::new();
                metrics.write(&mut w);
                figures.write(&mut w);
                for s in &sources.0 {
                    s.write(&mut w);
                }
                let body = w.into_bytes();
                let date = self.date(now);
                let mut h = Head::new(200, &date)
                    .header("content-type", crate::metrics::CONTENT_TYPE)
                    .header("cache-control", "no-store");
                self.finish_head(&mut h, minor, keep_alive, now);
                h.write_full(&mut self.out, &body, head_only);
            }
            Deferred::Error {
                err,
                id,
                keep_alive,
                minor,
            } => self.write_error_reply(&err, &id, keep_alive, minor, now),
        }
        true
    }

    /// A read's answer of `len` bytes found the large-answers pool spent.
    pub(super) fn large_refusal(&self, len: usize) -> RpcError {
        let cap = self.limits.large_answers_bytes;
        RpcError::new(
            ErrorKind::LimitReached,
            format!(
                "this answer ({len} bytes) waits for large answers other clients have not \
                 read yet (limits.large_answers_bytes = {cap}); try again shortly"
            ),
        )
        .with_meta("limit", "limits.large_answers_bytes")
        .with_meta("max", cap.to_string())
    }

    /// A JSON-RPC result holding one task: written whole when it fits the output bound;
    /// otherwise its head now and the task as the peer reads it. A read's large answer that
    /// finds the pool spent is refused instead.
    pub(super) fn write_task_result(&mut self, answer: TaskAnswer, now: Now) {
        let TaskAnswer {
            mut json,
            id,
            keep_alive,
            minor,
            echo,
            acknowledges,
        } = answer;
        let mut prefix = Vec::with_capacity(48);
        prefix.extend_from_slice(b"{\"id\":");
        prefix.extend_from_slice(id.as_json().as_bytes());
        prefix.extend_from_slice(b",\"jsonrpc\":\"2.0\",\"result\":");
        json.wrap(&prefix, b"}");
        let bound = self.limits.max_output_bytes;
        let len = if json.likely_large(bound) {
            json.measure()
        } else {
            0
        };
        if len <= bound {
            self.write_json_keep(200, &json.to_vec(), keep_alive, minor, echo, now);
            return;
        }
        // The bytes are shared with the store while the task is unchanged, but a reader
        // that does not read keeps what the store has since replaced: the pool bounds that.
        if !acknowledges && !self.admit_large(len) {
            let err = self.large_refusal(len);
            self.write_error_reply(&err, &id, keep_alive, minor, now);
            return;
        }
        let date = self.date(now);
        let mut h = Head::new(200, &date).header("content-type", "application/json");
        if let Some(echo) = echo {
            h = h.header("a2a-extensions", echo);
        }
        self.finish_head(&mut h, minor, keep_alive, now);
        h.write_sized(&mut self.out, len);
        self.tail = Some(Tail {
            json,
            chunked: false,
        });
        self.pump_tail();
    }

    /// A JSON answer; `echo` is the `A2A-Extensions` value of a successful one.
    pub(super) fn write_json_keep(
        &mut self,
        status: u16,
        doc: &[u8],
        keep_alive: bool,
        minor: u8,
        echo: Option<String>,
        now: Now,
    ) {
        let date = self.date(now);
        let mut h = Head::new(status, &date).header("content-type", "application/json");
        if let Some(echo) = echo {
            h = h.header("a2a-extensions", echo);
        }
        self.finish_head(&mut h, minor, keep_alive, now);
        h.write_full(&mut self.out, doc, false);
    }

    /// A JSON-RPC error answer at the table's HTTP status, with `Retry-After` where the
    /// table gives one. A refused request echoes no extension.
    pub(super) fn write_error_reply(
        &mut self,
        err: &RpcError,
        id: &RequestId,
        keep_alive: bool,
        minor: u8,
        now: Now,
    ) {
        self.note_error(err.kind);
        let mut doc = Vec::with_capacity(128);
        jsonrpc::write_error(&mut doc, id, err);
        let date = self.date(now);
        let mut h = Head::new(err.http_status(), &date).header("content-type", "application/json");
        if let Some(secs) = err.retry_after() {
            h = h.header("retry-after", secs.to_string());
        }
        self.finish_head(&mut h, minor, keep_alive, now);
        h.write_full(&mut self.out, &doc, false);
    }

    /// A response with no body beyond its status: refusals, preflights.
    pub(super) fn write_simple(
        &mut self,
        status: u16,
        allow: Option<&'static str>,
        now: Now,
        head: &RequestHead,
        close: bool,
    ) {
        let date = self.date(now);
        let mut h = Head::new(status, &date);
        if let Some(allow) = allow {
            h = h.header("allow", allow);
        }
        if status == 204 && allow == Some(CARD_ALLOW) {
            // The card is public: any page may read it.
            h = h
                .header("access-control-allow-origin", "*")
                .header("access-control-allow-methods", CARD_ALLOW);
        }
        self.finish_head(&mut h, head.minor_version, head.keep_alive && !close, now);
        h.write_full(&mut self.out, b"", false);
    }

    /// Marks the head for closing or, for an HTTP/1.0 peer that asked, keeping alive.
    /// Completes the answer's record: this head is the answer (see [`crate::reqlog`]).
    pub(super) fn finish_head(&mut self, h: &mut Head<'_>, minor: u8, keep_alive: bool, now: Now) {
        self.answered(h.status, now);
        self.cors_headers(h);
        if let Some(hsts) = &self.hsts {
            h.headers.push(("strict-transport-security", hsts.clone()));
        }
        if !keep_alive {
            h.close = true;
            self.closing = true;
        } else if minor == 0 {
            h.headers.push(("connection", Cow::Borrowed("keep-alive")));
        }
    }

    /// Answers a framing error and closes: after it the byte stream cannot be trusted.
    pub(super) fn refuse_and_close(&mut self, status: u16, reason: &str, now: Now) {
        if !self.m_open {
            // Bytes that never made a request head are counted too.
            self.req_started = self.head_started.unwrap_or(now.mono_ms);
            self.count_request(MethodLabel::Other);
        }
        if self.keep == Keep::All && self.current.is_none() {
            // Bytes that never made a request head: recorded without a route.
            let started = self.head_started.unwrap_or(now.mono_ms);
            self.current = Some(Box::new(RequestRecord::new(None, started)));
        }
        self.answered(status, now);
        let date = self.date(now);
        let mut h = Head::new(status, &date).header("content-type", "text/plain; charset=utf-8");
        h.close = true;
        let body = format!("{reason}\n");
        h.write_full(&mut self.out, body.as_bytes(), false);
        self.closing = true;
    }
}
