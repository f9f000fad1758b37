//! Agent processes: conversation turns for the conversation agent, subagents by handle,
//! and the conversations they keep.

use super::*;

impl Runtime {
    pub(super) fn record_turn(
        &mut self,
        inst: &mut Inst<'_>,
        owner: &Principal,
        (context_id, name): (&str, &str),
        task_id: &str,
        message: &Message,
        now: Now,
    ) {
        let key = (owner.id.clone(), context_id.to_owned());
        if !self.conversations.contains(&key) {
            self.make_room_for_conversation(inst, now);
        }
        let max_bytes = inst.config().tasks.history_bytes;
        let c = self.conversations.touch_or_insert_with(key, || {
            Conversation::new(context_id, name, owner, now.epoch_ms)
        });
        // Each part's text, or the whole part as JSON where it has none.
        let mut text = String::new();
        for (i, p) in message.parts.iter().enumerate() {
            if i > 0 {
                text.push('\n');
            }
            match &p.content {
                PartContent::Text(t) => text.push_str(t),
                _ => {
                    if let Ok(v) = serde_json::to_value(p) {
                        text.push_str(&v.to_string());
                    }
                }
            }
        }
        c.keep(
            Said::new(Speaker::User, task_id, text, now.epoch_ms),
            max_bytes,
        );
        c.turns += 1;
        c.version += 1;
        c.task = Some(task_id.to_owned());
        c.updated = now.epoch_ms;
        let doc = conversation_doc(c);
        let id = conversation_key(c);
        publish_conversation(inst, &id, &owner.id, doc, now);
    }

    /// Drops the least recently active conversations while `max_tasks` of them are kept.
    fn make_room_for_conversation(&mut self, inst: &mut Inst<'_>, now: Now) {
        let max = inst.config().tasks.max_tasks.max(1);
        while self.conversations.len() >= max {
            let Some(c) = self.conversations.pop_oldest() else {
                break;
            };
            let id = conversation_key(&c);
            inst.withdraw_object(ObjectKind::Conversation, &id);
            push(
                inst,
                "conversation.removed",
                json!({ "id": id }),
                Some(c.owner.id),
                now,
            );
        }
    }

    /// The subagent a handle names for this caller, starting its process on first use.
    /// A handle is `<kind>` or `<kind>:<label>`, where the kind is a `[[subagents]]` name;
    /// a handle another principal holds is "no such subagent" to everyone else.
    pub(super) fn ensure_subagent(
        &mut self,
        inst: &mut Inst<'_>,
        handle: &str,
        p: &Principal,
        text: &str,
        now: Now,
    ) -> Result<(), RpcError> {
        if let Some(s) = self.subagents.get(handle) {
            return if p.may_see(&s.owner) {
                Ok(())
            } else {
                Err(not_found("subagent"))
            };
        }
        let kind = handle.split(':').next().unwrap_or("");
        let Some(spec) = self.subagent_kinds.get(kind) else {
            let kinds: Vec<&str> = self.subagent_kinds.keys().map(String::as_str).collect();
            return Err(invalid_args(
                "subagent.send",
                "handle",
                if kinds.is_empty() {
                    "no subagents are configured on this instance ([[subagents]])".to_owned()
                } else {
                    format!("{kind:?} is not a subagent kind; a handle is <kind> or <kind>:<label>, and the kinds are {}", kinds.join(", "))
                },
            ));
        };
        if handle.len() > 128 || handle.chars().any(|c| c.is_control() || c == '/') {
            return Err(invalid_args(
                "subagent.send",
                "handle",
                "at most 128 characters, no control characters or slashes",
            ));
        }
        let mut spec = spec.clone();
        spec.name = handle.to_owned();
        self.make_room_for_subagent(inst, p, now)?;
        let process = AgentProcess::new(spec, self.agent_tx.clone()).map_err(|e| {
            RpcError::new(
                ErrorKind::Internal,
                format!("subagent {handle} cannot start: {e}"),
            )
        })?;
        tracing::info!(%handle, owner = %p.id, "subagent created");
        self.subagents.insert(
            handle.to_owned(),
            Subagent {
                handle: handle.to_owned(),
                owner: p.clone(),
                process,
                status: "idle",
                attempt: 0,
                instruction: json!(text),
                result: Value::Null,
                error: None,
                requested_by: p.id.clone(),
                created: now.epoch_ms,
                updated: now.epoch_ms,
            },
        );
        Ok(())
    }

    /// Whether a subagent has a turn in flight.
    fn subagent_busy(&self, handle: &str) -> bool {
        self.agent_tasks
            .values()
            .any(|t| matches!(t, AgentTask::Subagent(h) if h == handle))
    }

    /// Keeps the live subagents within their bounds before `p` gets a new one: past the
    /// caller's bound, its least recently used idle subagent is retired; past the instance's
    /// bound, anyone's. A bound with nothing idle to retire is a typed refusal, and nothing
    /// is started.
    fn make_room_for_subagent(
        &mut self,
        inst: &mut Inst<'_>,
        p: &Principal,
        now: Now,
    ) -> Result<(), RpcError> {
        let limits = self.limits;
        for (mine, max, key) in [
            (
                true,
                limits.max_subagents_per_principal,
                "limits.max_subagents_per_principal",
            ),
            (false, limits.max_subagents, "limits.max_subagents"),
        ] {
            let counted = |s: &&Subagent| !mine || s.owner.id == p.id;
            if self.subagents.values().filter(counted).count() < max {
                continue;
            }
            let idle = self
                .subagents
                .values()
                .filter(counted)
                .filter(|s| !self.subagent_busy(&s.handle))
                .min_by_key(|s| s.updated)
                .map(|s| s.handle.clone());
            match idle {
                Some(handle) => self.retire_subagent(inst, &handle, "to make room", now),
                None => {
                    let whose = if mine {
                        "this caller's"
                    } else {
                        "this instance's"
                    };
                    return Err(RpcError::new(
                        ErrorKind::LimitReached,
                        format!(
                            "{whose} {max} subagents are all working ({key}); \
                             kill one with subagent.kill or wait for one to finish"
                        ),
                    )
                    .with_meta("limit", key)
                    .with_meta("max", max.to_string()));
                }
            }
        }
        Ok(())
    }

    /// Ends a subagent for good: its process and threads stop, its entry goes, and the
    /// operators' feed hears `subagent.removed`.
    pub(super) fn retire_subagent(
        &mut self,
        inst: &mut Inst<'_>,
        handle: &str,
        why: &str,
        now: Now,
    ) {
        if let Some(s) = self.subagents.remove(handle) {
            tracing::info!(%handle, owner = %s.owner.id, "subagent removed {why}");
            // Dropping the process kills it and joins its monitor thread.
            drop(s);
            push(inst, "subagent.removed", json!({ "id": handle }), None, now);
        }
    }

    pub(super) fn visible_subagent(&self, handle: &str, p: &Principal) -> Result<String, RpcError> {
        match self.subagents.get(handle) {
            Some(s) if p.may_see(&s.owner) => Ok(s.handle.clone()),
            _ => Err(not_found("subagent")),
        }
    }

    pub(super) fn subagent_changed(&self, inst: &mut Inst<'_>, handle: &str, now: Now) {
        if let Some(s) = self.subagents.get(handle) {
            push(inst, "subagent", s.feed_doc(), None, now);
        }
    }

    /// What an agent process said, applied to its task (and to its subagent's state).
    pub(super) fn on_agent_event(&mut self, inst: &mut Inst<'_>, ev: AgentEvent, now: Now) {
        let subagent = (ev.agent != CONVERSATION_AGENT && self.subagents.contains_key(&ev.agent))
            .then(|| ev.agent.clone());
        match &ev.kind {
            AgentEventKind::Started { pid, restarts } => {
                tracing::info!(agent = %ev.agent, pid, restarts, "agent process started");
            }
            AgentEventKind::StartFailed { error, .. } => {
                tracing::warn!(agent = %ev.agent, %error, "agent process could not start");
                if let Some(h) = &subagent {
                    self.set_subagent(inst, h, "crashed", Some(error.clone()), None, now);
                }
            }
            AgentEventKind::Exited {
                description,
                in_flight,
            } => {
                tracing::warn!(agent = %ev.agent, %description, in_flight = in_flight.len(), "agent process ended");
                if let Some(h) = &subagent {
                    let killed = self.subagents.get(h).is_some_and(|s| s.status == "killed");
                    if !killed {
                        self.set_subagent(
                            inst,
                            h,
                            "crashed",
                            Some(format!("agent process {h} {description}")),
                            None,
                            now,
                        );
                    }
                }
            }
            _ => {}
        }
        let Some(task_id) = ev.task.clone() else {
            return;
        };
        let is_sub_task = matches!(self.agent_tasks.get(&task_id), Some(AgentTask::Subagent(_)));
        match &ev.kind {
            AgentEventKind::Reply { parts } if is_sub_task => {
                // A subagent's answer completes its subagent.send task with the op's result.
                let text = parts_text(parts);
                let handle = subagent.clone().unwrap_or_default();
                self.agent_tasks.remove(&task_id);
                done(
                    inst,
                    Some(&task_id),
                    Some(json!({"ok": true, "handle": handle, "reply": text})),
                    Some(text.clone()),
                    now,
                );
                self.set_subagent(inst, &handle, "idle", None, Some(json!(text)), now);
                return;
            }
            AgentEventKind::Reply { parts } => {
                let key = match self.agent_tasks.remove(&task_id) {
                    Some(AgentTask::Conversation(key)) => Some(key),
                    _ => None,
                };
                self.record_reply(inst, key, &task_id, parts, now);
            }
            AgentEventKind::Fail { error } => {
                self.agent_tasks.remove(&task_id);
                if let Some(h) = &subagent {
                    // A process that ended keeps saying so; only a turn that failed on its
                    // own leaves the subagent merely "failed".
                    let now_status = self.subagents.get(h).map_or("failed", |s| s.status);
                    let state = if matches!(now_status, "killed" | "crashed") {
                        now_status
                    } else {
                        "failed"
                    };
                    self.set_subagent(inst, h, state, Some(error.clone()), None, now);
                }
            }
            _ => {}
        }
        for c in agent::into_completions(ev) {
            complete(inst, c, now);
        }
    }

    pub(super) fn set_subagent(
        &mut self,
        inst: &mut Inst<'_>,
        handle: &str,
        state: &'static str,
        error: Option<String>,
        result: Option<Value>,
        now: Now,
    ) {
        if let Some(s) = self.subagents.get_mut(handle) {
            s.status = state;
            if error.is_some() {
                s.error = error;
            }
            if let Some(r) = result {
                s.result = r;
                s.error = None;
            }
            s.updated = now.epoch_ms;
        }
        self.subagent_changed(inst, handle, now);
    }

    /// The conversation agent's answer, kept in its conversation.
    pub(super) fn record_reply(
        &mut self,
        inst: &mut Inst<'_>,
        key: Option<ConversationKey>,
        task_id: &str,
        parts: &[Part],
        now: Now,
    ) {
        let max_bytes = inst.config().tasks.history_bytes;
        let is_ours = |c: &Conversation| c.task.as_deref() == Some(task_id);
        // The turn's own conversation, by its key; a search only for a reply whose turn
        // the runtime does not track (none arrives today: untracked turns are canceled).
        let found = match key {
            Some(key) => self
                .conversations
                .get(&key)
                .filter(|c| is_ours(c))
                .map(|_| key),
            None => self.conversations.find_key(is_ours),
        };
        let Some(c) = found.and_then(|key| self.conversations.touch(&key)) else {
            return;
        };
        c.keep(
            Said::new(Speaker::Agent, task_id, parts_text(parts), now.epoch_ms),
            max_bytes,
        );
        c.version += 1;
        c.updated = now.epoch_ms;
        let doc = conversation_doc(c);
        let id = conversation_key(c);
        publish_conversation(inst, &id, &c.owner.id, doc, now);
    }
}

/// Publishes a conversation's doc for `status` and, when the events feed is on, as a
/// `conversation` event: twice per turn, so the doc is copied only for a feed that exists.
fn publish_conversation(inst: &mut Inst<'_>, id: &str, owner: &str, doc: Value, now: Now) {
    if inst.feed().is_none() {
        inst.publish_object(ObjectKind::Conversation, id, Some(owner), doc);
        return;
    }
    inst.publish_object(ObjectKind::Conversation, id, Some(owner), doc.clone());
    push(inst, "conversation", doc, Some(owner.to_owned()), now);
}
