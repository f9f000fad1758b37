//! The request log's records: what each request was and how it was answered, kept for the
//! driver when it asks (see [`crate::reqlog`]).

use super::*;

impl Connection {
    /// Which requests to keep records of for the request log (none by default). A driver
    /// that keeps any takes them with [`Connection::poll_request_record`] after each call
    /// into the connection.
    pub fn keep_records(&mut self, keep: Keep) {
        self.keep = keep;
        if keep == Keep::Off {
            self.current = None;
            self.records.clear();
        }
    }

    /// The oldest record not yet taken.
    pub fn poll_request_record(&mut self) -> Option<RequestRecord> {
        let r = self.records.pop_front().map(|b| *b);
        if self.records.is_empty() && self.records.capacity() > 4 {
            // A burst of pipelined requests leaves no large queue behind on an idle
            // connection.
            self.records = VecDeque::new();
        }
        r
    }

    /// How many records were dropped (the queue was full) since this was last asked, and
    /// resets the count.
    pub fn take_dropped_records(&mut self) -> Dropped {
        std::mem::take(&mut self.dropped)
    }

    /// A record of the request `head` names, read at `started`, with the request's id.
    pub(super) fn new_record(
        &self,
        head: Option<&RequestHead>,
        started: u64,
    ) -> Box<RequestRecord> {
        let mut r = Box::new(RequestRecord::new(head, started));
        if r.request_id.is_empty() {
            let (boot, n) = self.req_no;
            r.request_id = crate::reqlog::Label::new(&format!("{boot:x}-{n}"));
        }
        r
    }

    /// Queues a record for the driver, if it keeps that kind; counts it if the queue is
    /// full.
    pub(super) fn push_record(&mut self, r: Box<RequestRecord>) {
        let wanted = match self.keep {
            Keep::Off => false,
            Keep::Refusals => r.refusal.is_some(),
            Keep::All => true,
        };
        if !wanted {
            return;
        }
        if self.records.len() >= reqlog::MAX_RECORDS {
            self.dropped.records = self.dropped.records.saturating_add(1);
            if r.refusal.is_some() {
                self.dropped.refusals = self.dropped.refusals.saturating_add(1);
            }
            return;
        }
        self.records.push_back(r);
    }

    /// The request being answered was answered `status`: its record is complete.
    pub(super) fn answered(&mut self, status: u16, now: Now) {
        self.count_answer(status, now);
        if let Some(mut r) = self.current.take() {
            r.status = status;
            r.phase = Phase::Answered;
            r.duration_ms = now.mono_ms.saturating_sub(r.started_ms);
            self.push_record(r);
        }
    }

    /// A request's head was read: it is counted once its answer is framed, under `method`.
    pub(super) fn count_request(&mut self, method: MethodLabel) {
        self.m_method = method;
        self.m_error = None;
        self.m_open = true;
    }

    /// Counts the request being answered (once), with its latency from the `now` its head
    /// was read to this one.
    fn count_answer(&mut self, status: u16, now: Now) {
        if std::mem::take(&mut self.m_open) {
            if let Some(m) = &self.metrics {
                let ms = now.mono_ms.saturating_sub(self.req_started);
                m.answered(self.m_method, status, self.m_error, ms);
            }
        }
    }

    /// The head of the answer's stream was written: recorded now, and again at its end.
    pub(super) fn stream_started(&mut self, now: Now) {
        self.count_answer(200, now);
        if let Some(m) = &self.metrics {
            if !std::mem::replace(&mut self.m_stream, true) {
                m.stream_opened();
            }
        }
        if let Some(r) = self.current.as_mut() {
            r.status = 200;
            r.phase = Phase::StreamStarted;
            r.duration_ms = now.mono_ms.saturating_sub(r.started_ms);
            let copy = r.clone();
            self.push_record(copy);
        }
    }

    /// The answer's stream ended.
    pub(super) fn stream_ended(&mut self, now: Now) {
        if std::mem::take(&mut self.m_stream) {
            if let Some(m) = &self.metrics {
                m.stream_closed();
            }
        }
        if let Some(mut r) = self.current.take() {
            r.phase = Phase::StreamEnded;
            r.duration_ms = now.mono_ms.saturating_sub(r.started_ms);
            self.push_record(r);
        }
    }

    /// The answer being written refuses the request with `kind`.
    pub(super) fn note_error(&mut self, kind: ErrorKind) {
        self.m_error = Some(kind);
        if let Some(r) = self.current.as_mut() {
            r.error = Some(kind);
        }
    }

    /// The request concerns task `id`, unless one is already known.
    pub(super) fn note_task(&mut self, id: &str) {
        if let Some(r) = self.current.as_mut() {
            if r.task_id.is_empty() {
                r.task_id = Label::new(id);
            }
        }
    }

    /// A limiter refused the request `head`: its record, made now if only refusals are
    /// kept.
    pub(super) fn note_refusal(
        &mut self,
        head: &RequestHead,
        limiter: Limiter,
        retry_after_s: u32,
    ) {
        if let Some(m) = &self.metrics {
            m.refused(limiter);
        }
        if self.keep == Keep::Off {
            return;
        }
        let started = self.req_started;
        let r = self
            .current
            .get_or_insert_with(|| Box::new(RequestRecord::new(Some(head), started)));
        if r.request_id.is_empty() {
            let (boot, n) = self.req_no;
            r.request_id = crate::reqlog::Label::new(&format!("{boot:x}-{n}"));
        }
        r.refusal = Some(Refusal {
            limiter,
            retry_after_s,
            source: self.source,
        });
    }
}
