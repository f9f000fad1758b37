//! The command ops the runtime serves: workflows, plans, introspection, operator
//! controls, and the audit trail of them. The core hands each over typed ([`Op`]); each op
//! has its own function here.

use agentd_core::ext::command::table::OpId;
use agentd_core::host::{Op, SettablePath};

use super::*;

/// Every op this runtime serves: what it declares to the core
/// ([`agentd_core::HostCapabilities::ops`]), so the card lists them and the core hands them
/// over. The reserved `_instance.*` reports are not among them: subagents here are local
/// processes, so the core refuses those `OP_NOT_SERVED`.
pub const SERVED_OPS: [OpId; 17] = [
    OpId::WorkflowRun,
    OpId::WorkflowStatus,
    OpId::WorkflowCancel,
    OpId::WorkflowSignal,
    OpId::SubagentSend,
    OpId::SubagentKill,
    OpId::SubagentStatus,
    OpId::PlanGet,
    OpId::ConversationGet,
    OpId::RunGet,
    OpId::SubagentGet,
    OpId::DebugEvents,
    OpId::AdminDrain,
    OpId::AdminPause,
    OpId::AdminResume,
    OpId::AdminCancel,
    OpId::AdminSet,
];

impl Runtime {
    /// An `audit` event for a command, while introspection is on: every refusal and every
    /// op that changes something (successful reads are not mirrored).
    pub(super) fn audit(
        &self,
        inst: &mut Inst<'_>,
        (p, sid): (&Principal, Option<&str>),
        op: &str,
        args: &Map<String, Value>,
        refused: Option<&RpcError>,
        now: Now,
    ) {
        if !inst.config().introspection_enabled {
            return;
        }
        let read = agentd_core::ext::command::table::find(op)
            .is_some_and(|s| s.reply == agentd_core::ext::command::table::ReplyKind::Message);
        if read && refused.is_none() {
            return;
        }
        let target = agentd_core::audit::TARGET_ARGS
            .iter()
            .find_map(|k| args.get(*k).cloned())
            .unwrap_or(Value::Null);
        let outcome = match refused {
            None => "ok".to_owned(),
            Some(e) => format!("refused {}", e.code()),
        };
        let mut data = json!({"ts": now.epoch_ms, "principal": p.id, "role": p.role.as_str(),
                              "action": op, "target": target, "outcome": outcome});
        if let (Some(sid), Some(obj)) = (sid, data.as_object_mut()) {
            obj.insert("sid".into(), Value::String(sid.to_owned()));
        }
        let _ = inst.push_event(
            FeedEvent::Other {
                kind: "audit",
                data,
                owner: None,
            },
            now,
        );
    }

    /// Runs one command the core handed over: each op has its own function, its arguments
    /// typed. The core hands over only the ops [`SERVED_OPS`] declares (and the
    /// workflow-declared commands); anything else is refused here too, as a backstop.
    pub(super) fn command(
        &mut self,
        inst: &mut Inst<'_>,
        call: Call<'_>,
        op: Op,
        now: Now,
    ) -> Result<(), RpcError> {
        match op {
            Op::Declared { workflow, args, .. } => self.declared(inst, &call, &workflow, args, now),
            Op::WorkflowRun { workflow, inputs } => {
                self.workflow_run(inst, &call, &workflow, inputs, now)
            }
            Op::WorkflowStatus { run } => self.workflow_status(inst, &call, run.as_deref(), now),
            Op::WorkflowCancel { run } => self.workflow_cancel(inst, &call, &run, now),
            Op::WorkflowSignal { name, payload, run } => {
                self.workflow_signal(inst, &call, name, payload, run.as_deref(), now)
            }
            Op::PlanGet { id } => self.plan_get(inst, &call, id.as_deref(), now),
            Op::RunGet { run } => self.run_get(inst, &call, &run, now),
            Op::ConversationGet { id, limit } => {
                self.conversation_get(inst, &call, &id, limit, now)
            }
            Op::DebugEvents {
                after,
                limit,
                level,
                prefix,
            } => {
                debug_events(
                    inst,
                    &call,
                    after,
                    limit,
                    level.as_deref(),
                    prefix.as_deref(),
                    now,
                );
                Ok(())
            }
            Op::AdminDrain { reason } => self.admin_drain(inst, &call, reason, now),
            Op::AdminPause { run, reason } => {
                self.admin_pause(inst, &call, run.as_deref(), reason, now)
            }
            Op::AdminResume { run } => self.admin_resume(inst, &call, run.as_deref(), now),
            Op::AdminCancel { run, reason } => self.admin_cancel(inst, &call, &run, reason, now),
            Op::AdminSet { path, value } => self.admin_set(inst, &call, path, value, now),
            Op::SubagentSend { handle, message } => {
                self.subagent_send(inst, &call, handle, message, now)
            }
            Op::SubagentKill { handle, reason } => {
                self.subagent_kill(inst, &call, &handle, reason, now)
            }
            Op::SubagentStatus { handle } => self.subagent_status(inst, &call, &handle, now),
            Op::SubagentGet { handle } => self.subagent_get(inst, &call, &handle, now),
            other => Err(RpcError::new(
                ErrorKind::OpNotServed,
                format!(
                    "command {:?} is not served by this instance's runtime",
                    other.name()
                ),
            )
            .with_meta("op", other.name())),
        }
    }

    /// A workflow-declared command: starts its workflow with the arguments as inputs.
    fn declared(
        &mut self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        name: &str,
        args: Map<String, Value>,
        now: Now,
    ) -> Result<(), RpcError> {
        let wf = self.workflows.get(name).cloned().ok_or_else(|| {
            RpcError::new(
                ErrorKind::OpNotServed,
                format!("workflow {name:?} is not loaded"),
            )
        })?;
        self.start_run(inst, call, wf, Value::Object(args), call.op.to_owned(), now)
    }

    /// `workflow.run`.
    fn workflow_run(
        &mut self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        name: &str,
        inputs: Option<Map<String, Value>>,
        now: Now,
    ) -> Result<(), RpcError> {
        let wf = self.workflows.get(name).cloned();
        let roles = wf.as_ref().map(|w| w.roles()).unwrap_or_default();
        // Whether the caller may run it comes first: a caller that may not is told so, never
        // whether the workflow exists.
        if !agentd_core::view::may_run(call.principal, name, &roles) {
            return Err(RpcError::new(
                ErrorKind::PermissionDenied,
                format!("{} may not run workflow {name:?}", call.principal.id),
            )
            .with_meta("workflow", name));
        }
        let wf = wf.ok_or_else(|| {
            invalid_args(
                call.op,
                "workflow",
                format!("no workflow named {name:?} (the workflows are listed by the status op)"),
            )
        })?;
        let inputs = inputs.map(Value::Object).unwrap_or(json!({}));
        if let Some(schema) = &wf.inputs_schema {
            check_against(schema, &inputs, call.op, "inputs")?;
        }
        self.start_run(inst, call, wf, inputs, "workflow.run".into(), now)
    }

    /// `workflow.status`.
    fn workflow_status(
        &self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        run: Option<&str>,
        now: Now,
    ) -> Result<(), RpcError> {
        let ids: Vec<String> = match run {
            Some(id) => vec![self.visible_run(id, call.principal)?],
            None => {
                let mut v: Vec<&Run> = self
                    .runs
                    .values()
                    .filter(|r| call.principal.may_see(&r.owner))
                    .collect();
                v.sort_by_key(|r| (r.created, r.id.clone()));
                v.into_iter().map(|r| r.id.clone()).collect()
            }
        };
        let runs: Vec<Value> = ids
            .iter()
            .filter_map(|id| self.runs.get(id))
            .map(|r| json!({"run": r.id, "workflow": r.workflow.name, "status": r.status.as_str(), "output": r.output, "error": r.error}))
            .collect();
        answer(inst, call.id, json!({ "runs": runs }), now);
        Ok(())
    }

    /// `workflow.cancel`.
    fn workflow_cancel(
        &mut self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        run: &str,
        now: Now,
    ) -> Result<(), RpcError> {
        let id = self.visible_run(run, call.principal)?;
        self.refuse_final(&id)?;
        self.started(inst, call, LinkKind::Run, &id, now)?;
        self.cancel_run(
            inst,
            &id,
            &format!("cancelled by {}", call.principal.id),
            true,
            now,
        );
        done(
            inst,
            call.task_id,
            None,
            Some(format!("run {id} cancelled")),
            now,
        );
        Ok(())
    }

    /// `workflow.signal`.
    fn workflow_signal(
        &mut self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        name: String,
        payload: Option<Value>,
        run: Option<&str>,
        now: Now,
    ) -> Result<(), RpcError> {
        let payload = payload.unwrap_or(Value::Null);
        let targets: Vec<String> = match run {
            Some(id) => vec![self.visible_run(id, call.principal)?],
            None => self
                .runs
                .values()
                .filter(|r| r.owner.id == call.principal.id)
                .map(|r| r.id.clone())
                .collect(),
        };
        let waiting: Vec<String> = targets
            .into_iter()
            .filter(|id| {
                self.runs.get(id).is_some_and(
                    |r| matches!(&r.waiting, Waiting::Signal { name: n, .. } if *n == name),
                )
            })
            .collect();
        let link = waiting.first().cloned().unwrap_or_else(|| name.clone());
        self.started(inst, call, LinkKind::Run, &link, now)?;
        for id in &waiting {
            self.step_finished(inst, id, Ok(payload.clone()), now);
        }
        done(
            inst,
            call.task_id,
            Some(json!({"signal": name, "delivered": waiting.len()})),
            None,
            now,
        );
        Ok(())
    }

    /// `plan.get`.
    fn plan_get(
        &self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        id: Option<&str>,
        now: Now,
    ) -> Result<(), RpcError> {
        let p = call.principal;
        // `id` names the conversation in the caller's namespace (§7.6): its own name for it,
        // or (for an operator) the internal key.
        let run = match id {
            Some(ctx) => self
                .runs
                .values()
                .filter(|r| {
                    ((r.context_name == ctx && r.owner.id == p.id)
                        || (p.is_operator() && r.context_id == ctx))
                        && p.may_see(&r.owner)
                })
                .max_by_key(|r| r.created),
            None => self
                .runs
                .values()
                .filter(|r| r.owner.id == p.id)
                .max_by_key(|r| r.created),
        };
        let doc = match (run, id) {
            (Some(r), _) => {
                let name = if r.owner.id == p.id {
                    &r.context_name
                } else {
                    &r.context_id
                };
                json!({"conversation": name, "plan": r.plan(), "progress": r.progress()})
            }
            (None, Some(ctx)) => {
                if !self
                    .conversations
                    .values()
                    .any(|c| c.owner.id == p.id && c.name == ctx)
                    && !p.is_operator()
                {
                    return Err(not_found("conversation"));
                }
                json!({"conversation": ctx, "plan": null, "progress": null})
            }
            (None, None) => json!({"conversation": "", "plan": null, "progress": null}),
        };
        answer(inst, call.id, doc, now);
        Ok(())
    }

    /// `run.get`.
    fn run_get(
        &self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        run: &str,
        now: Now,
    ) -> Result<(), RpcError> {
        let id = self.visible_run(run, call.principal)?;
        let r = &self.runs[&id];
        let mut doc = r.doc();
        let steps: Map<String, Value> = r
            .workflow
            .steps
            .iter()
            .zip(&r.steps)
            .map(|(d, s)| {
                (
                    d.id.clone(),
                    json!({"status": s.status, "attempt": s.attempt, "started": s.started,
                           "finished": s.finished, "error": s.error, "wait": s.wait,
                           "output": cut_strings(&s.output, RUN_GET_OUTPUT_BYTES)}),
                )
            })
            .collect();
        doc["steps"] = Value::Object(steps);
        doc["vars"] = json!({"inputs": r.inputs});
        answer(inst, call.id, json!({ "run": doc }), now);
        Ok(())
    }

    /// `conversation.get`.
    fn conversation_get(
        &self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        id: &str,
        limit: Option<u64>,
        now: Now,
    ) -> Result<(), RpcError> {
        let limit = limit.unwrap_or(200).min(1000) as usize;
        let p = call.principal;
        let c = self
            .conversations
            .values()
            // The caller's own name for it, or the internal key (how operators address
            // conversations, §7.6).
            .find(|c| {
                ((c.name == id && c.owner.id == p.id) || c.context_id == id) && p.may_see(&c.owner)
            })
            .ok_or_else(|| not_found("conversation"))?;
        let skip = c.messages.len().saturating_sub(limit);
        // Kept cut (at CONVERSATION_STRING_BYTES): shown as kept.
        let messages: Vec<&Said> = c.messages.iter().skip(skip).collect();
        let doc = json!({"conversation": {
            "id": conversation_key(c),
            "kind": "a2a",
            "version": c.version,
            "turns": c.turns,
            "est_tokens": 0,
            "principal": c.owner.id,
            "task": c.task,
            "skills": [],
            "plan": null,
            "summary": null,
            "total_messages": c.total_messages,
            "messages": messages,
            "updated": c.updated,
        }});
        answer(inst, call.id, doc, now);
        Ok(())
    }

    /// `admin.drain`.
    fn admin_drain(
        &mut self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        reason: Option<String>,
        now: Now,
    ) -> Result<(), RpcError> {
        let reason = reason.unwrap_or_else(|| "admin.drain".to_owned());
        self.started(inst, call, LinkKind::Run, "instance", now)?;
        done(
            inst,
            call.task_id,
            Some(json!({"ok": true, "state": "draining", "reason": reason})),
            None,
            now,
        );
        self.start_drain(inst, &reason, now);
        Ok(())
    }

    /// `admin.pause`: one run, or the whole instance.
    fn admin_pause(
        &mut self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        run: Option<&str>,
        reason: Option<String>,
        now: Now,
    ) -> Result<(), RpcError> {
        let reason = reason.unwrap_or_else(|| "admin.pause".to_owned());
        if let Some(id) = run {
            let id = self.any_run(id)?;
            self.refuse_final(&id)?;
            self.started(inst, call, LinkKind::Run, &id, now)?;
            if let Some(r) = self.runs.get_mut(&id) {
                r.held = true;
                if r.waiting == Waiting::None {
                    r.status = RunStatus::Paused;
                }
            }
            self.run_changed(inst, &id, now);
            done(
                inst,
                call.task_id,
                Some(json!({"ok": true, "paused": id})),
                None,
                now,
            );
        } else {
            self.started(inst, call, LinkKind::Run, "instance", now)?;
            inst.set_paused(true, &reason, now);
            tracing::info!(%reason, "instance paused");
            done(
                inst,
                call.task_id,
                Some(json!({"ok": true, "state": "paused", "reason": reason})),
                None,
                now,
            );
        }
        Ok(())
    }

    /// `admin.resume`: one run, or the whole instance.
    fn admin_resume(
        &mut self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        run: Option<&str>,
        now: Now,
    ) -> Result<(), RpcError> {
        if let Some(id) = run {
            let id = self.any_run(id)?;
            self.refuse_final(&id)?;
            self.started(inst, call, LinkKind::Run, &id, now)?;
            if let Some(r) = self.runs.get_mut(&id) {
                r.held = false;
            }
            self.advance(inst, &id, now);
            done(
                inst,
                call.task_id,
                Some(json!({"ok": true, "resumed": id})),
                None,
                now,
            );
            return Ok(());
        }
        self.started(inst, call, LinkKind::Run, "instance", now)?;
        inst.set_paused(false, "", now);
        tracing::info!("instance resumed");
        let held: Vec<String> = self
            .runs
            .values()
            .filter(|r| r.status == RunStatus::Paused && !r.held)
            .map(|r| r.id.clone())
            .collect();
        for id in held {
            self.advance(inst, &id, now);
        }
        for turn in std::mem::take(&mut self.held_turns) {
            // Only turns whose task still waits for them (not ended meanwhile by
            // admin.cancel, a drain or a restart).
            let live = match &turn {
                Effect::Turn { task_id, .. } => {
                    inst.task_state(task_id).is_some_and(|s| !s.is_terminal())
                }
                _ => true,
            };
            if live {
                self.on_effect(inst, turn, now);
            }
        }
        done(
            inst,
            call.task_id,
            Some(json!({"ok": true, "state": "running"})),
            None,
            now,
        );
        Ok(())
    }

    /// `admin.cancel`: an agent's task, or any run (by its id or its task's).
    fn admin_cancel(
        &mut self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        target: &str,
        reason: Option<String>,
        now: Now,
    ) -> Result<(), RpcError> {
        let reason = reason.unwrap_or_else(|| "admin.cancel".to_owned());
        // An agent's task (a turn or a subagent send), by its id: canceled, and its agent
        // told to stop.
        if let Some(who) = self.agent_tasks.get(target).cloned() {
            self.started(inst, call, LinkKind::Turn, target, now)?;
            match &who {
                AgentTask::Conversation(_) => {
                    if let Some(a) = &self.conversation {
                        a.cancel(target);
                    }
                }
                AgentTask::Subagent(h) => {
                    if let Some(s) = self.subagents.get(h) {
                        s.process.cancel(target);
                    }
                }
            }
            self.agent_tasks.remove(target);
            let why = format!("cancelled by the operator: {reason}");
            status(inst, target, TaskState::Canceled, why, now);
            done(
                inst,
                call.task_id,
                Some(json!({"ok": true, "cancelled": target})),
                None,
                now,
            );
            return Ok(());
        }
        // A run by its id, or by the task that tracks it.
        let id = self
            .runs
            .contains_key(target)
            .then(|| target.to_owned())
            .or_else(|| self.task_runs.get(target).cloned())
            .ok_or_else(|| not_found("run"))?;
        self.refuse_final(&id)?;
        self.started(inst, call, LinkKind::Run, &id, now)?;
        self.cancel_run(
            inst,
            &id,
            &format!("cancelled by the operator: {reason}"),
            true,
            now,
        );
        done(
            inst,
            call.task_id,
            Some(json!({"ok": true, "cancelled": id})),
            None,
            now,
        );
        Ok(())
    }

    /// `admin.set`: the value parsed with the path's own type, then applied until the next
    /// reload.
    fn admin_set(
        &mut self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        path: SettablePath,
        value: Value,
        now: Now,
    ) -> Result<(), RpcError> {
        let parsed = match path {
            SettablePath::IntrospectionEnabled => json!(parse_bool(&value).ok_or_else(|| {
                invalid_args(
                    call.op,
                    "value",
                    "a2a.introspection.enabled takes true or false",
                )
            })?),
            SettablePath::AgentApproval => {
                let a = value.as_str().and_then(Approval::parse).ok_or_else(|| {
                    invalid_args(
                        call.op,
                        "value",
                        "agent.approval takes \"auto\", \"ask\" or \"deny\"",
                    )
                })?;
                json!(a.as_str())
            }
        };
        self.started(inst, call, LinkKind::Run, "instance", now)?;
        let path = path.as_str();
        match path {
            "a2a.introspection.enabled" => {
                let on = parsed == json!(true);
                inst.set_introspection(on, "admin.set", now);
                logring::set_recording(on);
            }
            _ => {
                self.approval =
                    Approval::parse(parsed.as_str().unwrap_or("auto")).unwrap_or_default();
                let _ = inst.push_event(
                    FeedEvent::Other {
                        kind: "config",
                        data: json!({"paths": [path], "source": "admin.set"}),
                        owner: None,
                    },
                    now,
                );
            }
        }
        tracing::info!(path, value = %parsed, by = %call.principal.id, "admin.set");
        done(
            inst,
            call.task_id,
            Some(json!({"path": path, "value": parsed})),
            None,
            now,
        );
        Ok(())
    }

    /// `subagent.send`: starts the subagent on first use, then hands it the turn.
    fn subagent_send(
        &mut self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        handle: String,
        text: String,
        now: Now,
    ) -> Result<(), RpcError> {
        self.ensure_subagent(inst, &handle, call.principal, &text, now)?;
        self.started(inst, call, LinkKind::Subagent, &handle, now)?;
        let task_id = call.task_id.unwrap_or_default().to_owned();
        let turn = TurnIn {
            task: task_id.clone(),
            context: call.context_id.to_owned(),
            principal: call.principal.id.clone(),
            parts: vec![Part::text(text.clone())],
            trace: call.trace.cloned(),
        };
        let sub = self.subagents.get_mut(&handle).expect("ensured above");
        sub.attempt += 1;
        sub.instruction = json!(text);
        sub.status = "working";
        sub.updated = now.epoch_ms;
        match sub.process.turn(turn) {
            Ok(()) => {
                self.agent_tasks
                    .insert(task_id, AgentTask::Subagent(handle.clone()));
            }
            Err(e) => status(inst, &task_id, TaskState::Failed, e.to_string(), now),
        }
        self.subagent_changed(inst, &handle, now);
        Ok(())
    }

    /// `subagent.kill`.
    fn subagent_kill(
        &mut self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        handle: &str,
        reason: Option<String>,
        now: Now,
    ) -> Result<(), RpcError> {
        let handle = self.visible_subagent(handle, call.principal)?;
        let reason = reason.unwrap_or_else(|| "subagent.kill".to_owned());
        self.started(inst, call, LinkKind::Subagent, &handle, now)?;
        let sub = self.subagents.get_mut(&handle).expect("visible above");
        // Its tasks fail with the reason (the process reports them), then it goes: a killed
        // subagent holds no process, thread or entry.
        sub.process.kill(&call.principal.id, &reason);
        self.retire_subagent(inst, &handle, "by subagent.kill", now);
        done(
            inst,
            call.task_id,
            Some(json!({"ok": true, "handle": handle})),
            None,
            now,
        );
        Ok(())
    }

    /// `subagent.status`.
    fn subagent_status(
        &self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        handle: &str,
        now: Now,
    ) -> Result<(), RpcError> {
        let handle = self.visible_subagent(handle, call.principal)?;
        let s = &self.subagents[&handle];
        let mut doc =
            json!({"handle": s.handle, "status": s.status, "mode": "process", "result": s.result});
        if let Some(e) = &s.error {
            doc["error"] = json!(e);
        }
        answer(inst, call.id, doc, now);
        Ok(())
    }

    /// `subagent.get`.
    fn subagent_get(
        &self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        handle: &str,
        now: Now,
    ) -> Result<(), RpcError> {
        let handle = self.visible_subagent(handle, call.principal)?;
        let s = &self.subagents[&handle];
        let doc = json!({"subagent": {
            "handle": s.handle, "mode": "process", "status": s.status, "attempt": s.attempt,
            "tokens": 0, "instruction": s.instruction, "result": s.result, "error": s.error,
            "requested_by": s.requested_by, "created": s.created, "updated": s.updated,
            "node": null,
        }});
        answer(inst, call.id, doc, now);
        Ok(())
    }

    /// Creates the call's task, tracking `link`. A client that already left has no task to
    /// start: the work is not done either.
    pub(super) fn started(
        &self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        kind: LinkKind,
        id: &str,
        now: Now,
    ) -> Result<(), RpcError> {
        match inst.handle_completion(
            Completion::CommandStarted {
                call: call.id,
                link: Link {
                    kind,
                    id: id.to_owned(),
                },
            },
            now,
        ) {
            Ok(()) => Ok(()),
            Err(e) => Err(RpcError::new(
                ErrorKind::Internal,
                format!("the task could not be started: {e:?}"),
            )),
        }
    }

    pub(super) fn visible_run(&self, id: &str, p: &Principal) -> Result<String, RpcError> {
        match self.runs.get(id) {
            Some(r) if p.may_see(&r.owner) => Ok(r.id.clone()),
            _ => Err(not_found("run")),
        }
    }

    pub(super) fn any_run(&self, id: &str) -> Result<String, RpcError> {
        self.runs
            .get(id)
            .map(|r| r.id.clone())
            .ok_or_else(|| not_found("run"))
    }

    pub(super) fn refuse_final(&self, id: &str) -> Result<(), RpcError> {
        let r = &self.runs[id];
        if r.status.is_final() {
            return Err(RpcError::new(
                ErrorKind::TaskNotCancelable,
                format!("run {id} is already {}", r.status.as_str()),
            )
            .with_meta("run", id));
        }
        Ok(())
    }
}

/// `debug.events`: lines of the live log ring.
fn debug_events(
    inst: &mut Inst<'_>,
    call: &Call<'_>,
    after: Option<u64>,
    limit: Option<u64>,
    level: Option<&str>,
    prefix: Option<&str>,
    now: Now,
) {
    let limit = limit.map(|l| l as usize).unwrap_or(logring::DEFAULT_LIMIT);
    let doc = logring::read(after.unwrap_or(0), limit, level, prefix);
    answer(inst, call.id, doc, now);
}
