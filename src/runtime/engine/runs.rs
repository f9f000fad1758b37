//! Workflow runs: starting one, taking it step by step (exec, human gates, signals, peer
//! calls), finishing, cancelling, and the drain that waits for them.

use super::*;
use agentd_core::trace::AttrValue;

/// How often a drain that is still waiting says what for.
const DRAIN_REPORT_EVERY_MS: u64 = 10_000;

impl Runtime {
    pub(super) fn start_run(
        &mut self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        wf: Arc<Workflow>,
        inputs: Value,
        start: String,
        now: Now,
    ) -> Result<(), RpcError> {
        let id = format!("run-{}-{}", base36(now.epoch_ms), self.next_run);
        self.next_run += 1;
        let task_id = call.task_id.unwrap_or_default().to_owned();
        self.started(inst, call, LinkKind::Run, &id, now)?;
        let run = Run {
            id: id.clone(),
            steps: vec![
                StepState {
                    status: "pending",
                    wait: Value::Null,
                    output: Value::Null,
                    ..Default::default()
                };
                wf.steps.len()
            ],
            workflow: wf,
            owner: call.principal.clone(),
            task_id: task_id.clone(),
            context_id: call.context_id.to_owned(),
            context_name: call.context_name.to_owned(),
            start,
            inputs,
            status: RunStatus::Running,
            held: false,
            current: Some(0),
            waiting: Waiting::None,
            cancel: Arc::new(AtomicBool::new(false)),
            created: now.epoch_ms,
            updated: now.epoch_ms,
            finished: None,
            output: Value::Null,
            error: None,
            trace: call.trace.cloned(),
        };
        tracing::info!(run = %id, workflow = %run.workflow.name, principal = %run.owner.id, "run started");
        self.runs.insert(id.clone(), run);
        self.task_runs.insert(task_id, id.clone());
        self.advance(inst, &id, now);
        Ok(())
    }

    /// Takes the run as far as it goes without waiting: starts its current step, and keeps
    /// going through steps that finish at once.
    pub(super) fn advance(&mut self, inst: &mut Inst<'_>, id: &str, now: Now) {
        loop {
            let paused = inst.is_paused();
            let Some(r) = self.runs.get_mut(id) else {
                return;
            };
            if r.status.is_final() || r.waiting != Waiting::None {
                return;
            }
            if paused || r.held {
                r.status = RunStatus::Paused;
                self.run_changed(inst, id, now);
                return;
            }
            let Some(i) = r.current else {
                let output = r
                    .workflow
                    .steps
                    .iter()
                    .zip(&r.steps)
                    .rev()
                    .find(|(_, s)| s.finished.is_some())
                    .map(|(_, s)| s.output.clone())
                    .unwrap_or(Value::Null);
                self.finish(inst, id, Ok(output), now);
                return;
            };
            r.status = RunStatus::Running;
            let step = r.workflow.steps[i].clone();
            let vars = r.vars();
            let approved = r.steps[i].wait.get("approved").is_some();
            let st = &mut r.steps[i];
            st.attempt += 1;
            st.status = "running";
            st.started = Some(now.epoch_ms);
            let attempt = st.attempt;
            r.updated = now.epoch_ms;
            let task_id = r.task_id.clone();
            let trace = r.trace.clone();
            push(
                inst,
                "step",
                json!({"run": id, "step": step.id, "kind": step.kind.name(), "phase": "start", "attempt": attempt}),
                None,
                now,
            );
            status(
                inst,
                &task_id,
                TaskState::Working,
                format!("step {} ({}) started", step.id, step.kind.name()),
                now,
            );
            match &step.kind {
                StepKind::Start => {
                    let args = self.runs[id].inputs.clone();
                    self.step_finished(inst, id, Ok(json!({ "args": args })), now);
                }
                StepKind::Exec {
                    program,
                    args,
                    env,
                    timeout_ms,
                    output,
                } => {
                    let rendered = args
                        .iter()
                        .map(|a| workflow::render(a, &vars))
                        .collect::<Result<Vec<_>, _>>()
                        .and_then(|args| {
                            let env = env
                                .iter()
                                .map(|(k, v)| Ok((k.clone(), workflow::render(v, &vars)?)))
                                .collect::<Result<Vec<_>, String>>()?;
                            Ok((args, env))
                        });
                    let (args, env) = match rendered {
                        Ok(x) => x,
                        Err(e) => {
                            self.step_finished(inst, id, Err(e), now);
                            continue;
                        }
                    };
                    let mut job = ExecJob {
                        program: program.clone(),
                        args,
                        env,
                        timeout: Duration::from_millis(*timeout_ms),
                        output: *output,
                    };
                    match self.approval {
                        Approval::Deny => {
                            let e = format!(
                                "exec steps are refused here (agent.approval = deny): {}",
                                job.program
                            );
                            self.step_finished(inst, id, Err(e), now);
                            continue;
                        }
                        Approval::Ask if !approved => {
                            let prompt = format!(
                                "Approve running {} {}? Answer {{\"approve\": true}} or {{\"approve\": false}}.",
                                job.program,
                                job.args.join(" ")
                            );
                            let schema = json!({"type": "object", "properties": {"approve": {"type": "boolean"}}, "required": ["approve"]});
                            if let Some(r) = self.runs.get_mut(id) {
                                r.steps[i].wait =
                                    json!({"approval": {"program": job.program, "args": job.args}});
                                r.waiting = Waiting::Gate { approval: true };
                            }
                            self.open_gate(
                                inst,
                                id,
                                prompt,
                                Some(schema),
                                Some("operator".into()),
                                now,
                            );
                            return;
                        }
                        _ => {}
                    }
                    let Some(r) = self.runs.get_mut(id) else {
                        return;
                    };
                    r.waiting = Waiting::Worker;
                    let cancel = r.cancel.clone();
                    let mail = self.mail.clone();
                    let run = id.to_owned();
                    // The step's span; its program gets the context in its environment,
                    // set last so it wins over the step's own `env`.
                    let span = crate::telemetry::WorkSpan::internal(
                        trace.as_ref(),
                        format!("exec {}", step.id),
                        vec![
                            ("agentd.run", AttrValue::Str(run.clone())),
                            ("agentd.step", AttrValue::Str(step.id.clone())),
                            (
                                "process.executable.path",
                                AttrValue::Str(job.program.clone()),
                            ),
                        ],
                    );
                    if let Some(t) = span.context() {
                        job.env.push(("TRACEPARENT".into(), t.traceparent()));
                        if let Some(s) = t.tracestate() {
                            job.env.push(("TRACESTATE".into(), s.to_owned()));
                        }
                    }
                    let spawned =
                        thread::Builder::new()
                            .name(format!("exec-{run}"))
                            .spawn(move || {
                                let result = exec::run(&job, &cancel);
                                span.end(result.as_ref().err().cloned());
                                mail.send(Msg::StepDone {
                                    run,
                                    step: i,
                                    attempt,
                                    result,
                                });
                            });
                    if let Err(e) = spawned {
                        r.waiting = Waiting::None;
                        self.step_finished(
                            inst,
                            id,
                            Err(format!("cannot start a worker: {e}")),
                            now,
                        );
                        continue;
                    }
                    self.run_changed(inst, id, now);
                    return;
                }
                StepKind::Human {
                    prompt,
                    schema,
                    channel,
                } => {
                    let text = match workflow::render(prompt, &vars) {
                        Ok(t) => t,
                        Err(e) => {
                            self.step_finished(inst, id, Err(e), now);
                            continue;
                        }
                    };
                    if let Some(r) = self.runs.get_mut(id) {
                        r.waiting = Waiting::Gate { approval: false };
                        r.steps[i].wait = json!({ "question": text });
                    }
                    self.open_gate(inst, id, text, schema.clone(), channel.clone(), now);
                    return;
                }
                StepKind::Signal { name, timeout_ms } => {
                    if let Some(r) = self.runs.get_mut(id) {
                        r.waiting = Waiting::Signal {
                            name: name.clone(),
                            until_mono: timeout_ms.map(|t| now.mono_ms + t),
                        };
                        r.status = RunStatus::Waiting;
                        r.steps[i].status = "waiting";
                        r.steps[i].wait = json!({ "signal": name });
                    }
                    self.run_changed(inst, id, now);
                    return;
                }
                StepKind::Send { .. } | StepKind::Delegate { .. } => {
                    if !self.start_peer_step(id, i, attempt, &step.kind, &vars) {
                        continue;
                    }
                    self.run_changed(inst, id, now);
                    return;
                }
            }
        }
    }

    /// Starts an `a2a.send` or `a2a.delegate` step on a worker; false when it failed at once
    /// (the failure is already reported to the run).
    pub(super) fn start_peer_step(
        &mut self,
        id: &str,
        i: usize,
        attempt: u32,
        kind: &StepKind,
        vars: &Value,
    ) -> bool {
        let built = (|| -> Result<(Arc<PeerClient>, OutboundSend, u64), String> {
            let (peer, send, timeout_ms) = match kind {
                StepKind::Send {
                    peer,
                    text,
                    timeout_ms,
                } => {
                    let text = workflow::render(text, vars)?;
                    (
                        peer,
                        OutboundSend::message(vec![Part::text(text)]),
                        *timeout_ms,
                    )
                }
                StepKind::Delegate {
                    peer,
                    target,
                    timeout_ms,
                } => {
                    let send = match target {
                        workflow::DelegateTarget::Objective(o) => {
                            OutboundSend::message(vec![Part::text(workflow::render(o, vars)?)])
                        }
                        workflow::DelegateTarget::Command { op, args } => {
                            let Value::Object(args) = workflow::render_value(args, vars)? else {
                                return Err("the command's arguments are not an object".into());
                            };
                            OutboundSend::command(op.clone(), args)
                        }
                    };
                    (peer, send, *timeout_ms)
                }
                _ => return Err("not a peer step".into()),
            };
            let client = self
                .peers
                .get(peer)
                .cloned()
                .ok_or_else(|| format!("peer {peer:?} is not configured"))?;
            Ok((client, send, timeout_ms))
        })();
        let (client, mut send, timeout_ms) = match built {
            Ok(x) => x,
            Err(e) => {
                self.mail.send(Msg::StepDone {
                    run: id.to_owned(),
                    step: i,
                    attempt,
                    result: Err(e),
                });
                if let Some(r) = self.runs.get_mut(id) {
                    r.waiting = Waiting::Worker;
                }
                return true;
            }
        };
        let Some(r) = self.runs.get_mut(id) else {
            return false;
        };
        // The same message id for the same step of the same run: a peer can tell a repeat.
        send.message_id = Some(format!("{}.{}.{attempt}", r.id, r.workflow.steps[i].id));
        r.waiting = Waiting::Worker;
        let cancel = r.cancel.clone();
        let mail = self.mail.clone();
        let run = id.to_owned();
        let trace = r.trace.clone();
        let span_name = format!("{} {}", kind.name(), client.name());
        let step_id = r.workflow.steps[i].id.clone();
        let spawned = thread::Builder::new()
            .name(format!("peer-{run}"))
            .spawn(move || {
                // The call's client span: the peer's server spans are its children.
                let span = crate::telemetry::WorkSpan::client(
                    trace.as_ref(),
                    span_name,
                    vec![
                        ("agentd.peer", AttrValue::Str(client.name().to_owned())),
                        ("agentd.run", AttrValue::Str(run.clone())),
                        ("agentd.step", AttrValue::Str(step_id)),
                    ],
                );
                send.trace = span.context().cloned();
                let deadline = std::time::Instant::now() + Duration::from_millis(timeout_ms);
                let result = client
                    .send(send, deadline, &cancel)
                    .map_err(|e| peer_failure(client.name(), &e))
                    .and_then(|o| peer_output(client.name(), o));
                span.end(result.as_ref().err().cloned());
                mail.send(Msg::StepDone {
                    run,
                    step: i,
                    attempt,
                    result,
                });
            });
        if let Err(e) = spawned {
            self.mail.send(Msg::StepDone {
                run: id.to_owned(),
                step: i,
                attempt,
                result: Err(format!("cannot start a worker: {e}")),
            });
        }
        true
    }

    /// Puts the run's task in `input-required` with the question, its schema and channel.
    pub(super) fn open_gate(
        &mut self,
        inst: &mut Inst<'_>,
        id: &str,
        question: String,
        schema: Option<Value>,
        channel: Option<String>,
        now: Now,
    ) {
        let Some(r) = self.runs.get_mut(id) else {
            return;
        };
        let operator_only = matches!(r.waiting, Waiting::Gate { approval: true });
        r.status = RunStatus::Waiting;
        if let Some(i) = r.current {
            r.steps[i].status = "waiting";
        }
        let task_id = r.task_id.clone();
        self.gates.insert(task_id.clone(), id.to_owned());
        complete(
            inst,
            Completion::Ask {
                task_id: task_id.clone(),
                schema,
                channel,
                operator_only,
            },
            now,
        );
        status(inst, &task_id, TaskState::InputRequired, question, now);
        self.run_changed(inst, id, now);
    }

    /// The gate's task was answered (the core held the answer to the gate's schema).
    pub(super) fn answer_gate(
        &mut self,
        inst: &mut Inst<'_>,
        id: &str,
        message: &Message,
        now: Now,
    ) {
        let answer = agentd_core::rpc::gate_answer(message);
        let Some(r) = self.runs.get_mut(id) else {
            return;
        };
        let approval = matches!(r.waiting, Waiting::Gate { approval: true });
        r.waiting = Waiting::None;
        r.status = RunStatus::Running;
        if approval {
            let Some(i) = r.current else { return };
            if answer.get("approve") == Some(&Value::Bool(true)) {
                r.steps[i].wait["approved"] = json!(true);
                // The exec step starts over, now approved: its attempt is not counted twice.
                r.steps[i].attempt = r.steps[i].attempt.saturating_sub(1);
                self.advance(inst, id, now);
            } else {
                self.step_finished(
                    inst,
                    id,
                    Err("the operator did not approve running it".into()),
                    now,
                );
            }
            return;
        }
        self.step_finished(inst, id, Ok(answer), now);
    }

    pub(super) fn on_step_done(
        &mut self,
        inst: &mut Inst<'_>,
        id: &str,
        step: usize,
        attempt: u32,
        result: Result<Value, String>,
        now: Now,
    ) {
        let Some(r) = self.runs.get_mut(id) else {
            return;
        };
        // A late report for a step the run left (cancelled, or a new attempt) changes nothing.
        if r.status.is_final() || r.current != Some(step) || r.steps[step].attempt != attempt {
            return;
        }
        r.waiting = Waiting::None;
        self.step_finished(inst, id, result, now);
    }

    /// Records the current step's end and moves on: to the next step, or to the run's end.
    pub(super) fn step_finished(
        &mut self,
        inst: &mut Inst<'_>,
        id: &str,
        result: Result<Value, String>,
        now: Now,
    ) {
        let Some(r) = self.runs.get_mut(id) else {
            return;
        };
        let Some(i) = r.current else { return };
        let step = r.workflow.steps[i].clone();
        r.waiting = Waiting::None;
        let st = &mut r.steps[i];
        st.finished = Some(now.epoch_ms);
        let (state, err) = match &result {
            Ok(v) => {
                st.status = "done";
                st.output = v.clone();
                ("done", None)
            }
            Err(e) => {
                st.status = "failed";
                st.error = Some(e.clone());
                ("failed", Some(e.clone()))
            }
        };
        let attempt = st.attempt;
        r.updated = now.epoch_ms;
        let (run_id, task_id) = (r.id.clone(), r.task_id.clone());
        push(
            inst,
            "step",
            json!({"run": run_id, "step": step.id, "phase": "done", "status": state, "attempt": attempt, "tokens": 0, "err": err}),
            None,
            now,
        );
        match result {
            Ok(_) => {
                r.current = step.next;
                if r.status != RunStatus::Paused {
                    r.status = RunStatus::Running;
                }
                status(
                    inst,
                    &task_id,
                    TaskState::Working,
                    format!("step {} done", step.id),
                    now,
                );
                self.run_changed(inst, id, now);
                self.advance(inst, id, now);
            }
            Err(e) => {
                tracing::info!(run = %id, step = %step.id, error = %e, "step failed");
                self.finish(inst, id, Err(format!("step {} failed: {e}", step.id)), now);
            }
        }
    }

    pub(super) fn finish(
        &mut self,
        inst: &mut Inst<'_>,
        id: &str,
        result: Result<Value, String>,
        now: Now,
    ) {
        let Some(r) = self.runs.get_mut(id) else {
            return;
        };
        r.finished = Some(now.epoch_ms);
        r.updated = now.epoch_ms;
        r.waiting = Waiting::None;
        let task_id = r.task_id.clone();
        let name = r.workflow.name.clone();
        match result {
            Ok(output) => {
                r.status = RunStatus::Completed;
                r.output = output.clone();
                done(
                    inst,
                    Some(&task_id),
                    Some(output),
                    Some(format!("workflow {name} completed")),
                    now,
                );
            }
            Err(e) => {
                r.status = RunStatus::Failed;
                r.error = Some(e.clone());
                status(inst, &task_id, TaskState::Failed, e, now);
            }
        }
        tracing::info!(run = %id, status = r.status.as_str(), "run finished");
        self.gates.remove(&task_id);
        self.run_changed(inst, id, now);
        self.retire(inst, id, now);
    }

    pub(super) fn cancel_run(
        &mut self,
        inst: &mut Inst<'_>,
        id: &str,
        reason: &str,
        cancel_task: bool,
        now: Now,
    ) {
        let Some(r) = self.runs.get_mut(id) else {
            return;
        };
        if r.status.is_final() {
            return;
        }
        r.cancel.store(true, Ordering::Relaxed);
        r.status = RunStatus::Cancelled;
        r.error = Some(reason.to_owned());
        r.finished = Some(now.epoch_ms);
        r.updated = now.epoch_ms;
        r.waiting = Waiting::None;
        if let Some(i) = r.current {
            if r.steps[i].status == "running" || r.steps[i].status == "waiting" {
                r.steps[i].status = "cancelled";
                r.steps[i].finished = Some(now.epoch_ms);
            }
        }
        let task_id = r.task_id.clone();
        self.gates.remove(&task_id);
        if cancel_task {
            status(inst, &task_id, TaskState::Canceled, reason.to_owned(), now);
        }
        tracing::info!(run = %id, %reason, "run cancelled");
        self.run_changed(inst, id, now);
        self.retire(inst, id, now);
    }

    /// Publishes the run's state: the status view and a `run` feed event.
    pub(super) fn run_changed(&self, inst: &mut Inst<'_>, id: &str, now: Now) {
        let Some(r) = self.runs.get(id) else { return };
        let doc = r.doc();
        inst.publish_object(ObjectKind::Run, id, Some(&r.owner.id), doc.clone());
        push(inst, "run", doc, Some(r.owner.id.clone()), now);
    }

    /// Keeps finished runs bounded.
    pub(super) fn retire(&mut self, inst: &mut Inst<'_>, id: &str, now: Now) {
        self.finished.push_back(id.to_owned());
        while self.finished.len() > FINISHED_RUNS_KEPT {
            let Some(old) = self.finished.pop_front() else {
                break;
            };
            if let Some(r) = self.runs.remove(&old) {
                self.task_runs.remove(&r.task_id);
                inst.withdraw_object(ObjectKind::Run, &old);
                push(
                    inst,
                    "run.removed",
                    json!({"id": old}),
                    Some(r.owner.id.clone()),
                    now,
                );
            }
        }
    }

    pub(super) fn on_timers(&mut self, inst: &mut Inst<'_>, now: Now) {
        let expired: Vec<(String, String)> = self
            .runs
            .values()
            .filter_map(|r| match &r.waiting {
                Waiting::Signal {
                    name,
                    until_mono: Some(t),
                } if now.mono_ms >= *t => Some((r.id.clone(), name.clone())),
                _ => None,
            })
            .collect();
        for (id, name) in expired {
            self.step_finished(
                inst,
                &id,
                Err(format!("no {name:?} signal arrived in time")),
                now,
            );
        }
    }

    pub(super) fn start_drain(&mut self, inst: &mut Inst<'_>, reason: &str, now: Now) {
        if self.draining.is_some() {
            return;
        }
        tracing::info!(%reason, "draining: finishing the work in flight, accepting no new work");
        inst.set_draining(reason, now);
        self.draining = Some((reason.to_owned(), None));
        self.drain_report_at = now.mono_ms;
    }

    /// What the drain waits for, in words an operator acts on: each task in flight and what
    /// tracks it (at most a few named, and how many more).
    fn in_flight_report(&self) -> String {
        const NAMED: usize = 5;
        let runs = self
            .runs
            .values()
            .filter(|r| !r.status.is_final())
            .map(|r| {
                let step = r
                    .current
                    .and_then(|i| r.workflow.steps.get(i))
                    .map_or(String::new(), |s| {
                        format!(", step {} ({})", s.id, s.kind.name())
                    });
                format!(
                    "task {} (run {} of workflow {}{step})",
                    r.task_id, r.id, r.workflow.name
                )
            });
        let turns = self.agent_tasks.iter().map(|(task, by)| match by {
            AgentTask::Conversation(_) => format!("task {task} (a turn of the conversation agent)"),
            AgentTask::Subagent(handle) => format!("task {task} (a turn of subagent {handle})"),
        });
        let mut all: Vec<String> = runs.chain(turns).collect();
        all.sort();
        let more = all.len().saturating_sub(NAMED);
        all.truncate(NAMED);
        let mut text = all.join("; ");
        if more > 0 {
            text.push_str(&format!("; and {more} more"));
        }
        text
    }

    /// Whether the drain is over: nothing runs any more (runs parked at a gate or waiting
    /// for a signal cannot finish on their own and are reported), and the last answers left
    /// or the grace period passed.
    pub(super) fn drain_done(&mut self, inst: &mut Inst<'_>, now: Now) -> bool {
        let Some((_, quiet_since)) = &mut self.draining else {
            return false;
        };
        // Work that cannot end on its own while it waits: a run waiting for a signal or
        // held by a pause, and turns held by a pause. Their tasks count as working, so they
        // are taken off the count. (A gate's task is input-required: not counted at all.)
        let parked: Vec<&String> = self
            .runs
            .values()
            .filter(|r| {
                !r.status.is_final()
                    && (matches!(r.waiting, Waiting::Signal { .. })
                        || (r.status == RunStatus::Paused && r.waiting == Waiting::None))
            })
            .map(|r| &r.task_id)
            .chain(self.held_turns.iter().filter_map(|e| match e {
                Effect::Turn { task_id, .. } => Some(task_id),
                _ => None,
            }))
            .collect();
        let busy = inst.tasks_in_flight().saturating_sub(parked.len());
        if busy > 0 {
            *quiet_since = None;
            // A drain can wait as long as the slowest turn or step is allowed to take: say
            // what it waits for at once and every little while, so a stop never looks hung.
            if now.mono_ms >= self.drain_report_at {
                self.drain_report_at = now.mono_ms + DRAIN_REPORT_EVERY_MS;
                tracing::info!(
                    tasks = busy,
                    waiting_for = %self.in_flight_report(),
                    "draining: waiting for the work in flight to finish (a second SIGTERM exits at once)"
                );
            }
            return false;
        }
        let since = *quiet_since.get_or_insert(now.mono_ms);
        if inst.waiters() > 0 && now.mono_ms - since < DRAIN_GRACE.as_millis() as u64 {
            return false;
        }
        if !parked.is_empty() {
            tracing::warn!(
                parked = parked.len(),
                "runs still wait at a gate or for a signal; the memory store does not keep them"
            );
        }
        true
    }
}

/// Why a peer step failed, in words that name the peer.
fn peer_failure(peer: &str, e: &PeerError) -> String {
    format!("peer {peer}: {e}")
}

/// A peer's answer as the step's output: a Message's content; a task's `<id>.result`
/// artifact if it has one, else its artifacts (one data part as the data, text as text).
/// A task that stops to ask something cannot be answered from here, so the step fails.
fn peer_output(peer: &str, outcome: PeerOutcome) -> Result<Value, String> {
    fn content(parts: &[Part]) -> Value {
        if let [p] = parts {
            if let agentd_core::a2a::types::PartContent::Data(d) = &p.content {
                return d.clone();
            }
        }
        Value::String(parts_text(parts))
    }
    match outcome {
        PeerOutcome::Message(m) => Ok(content(&m.parts)),
        PeerOutcome::Task(t) => {
            if t.status.state != TaskState::Completed {
                let asks = t
                    .status
                    .message
                    .as_ref()
                    .map(|m| parts_text(&m.parts))
                    .unwrap_or_default();
                return Err(format!(
                    "peer {peer}: its task {} stopped in {}: {asks}",
                    t.id,
                    t.status.state.as_str()
                ));
            }
            let result = format!("{}.result", t.id);
            if let Some(a) = t.artifacts.iter().find(|a| a.artifact_id == result) {
                return Ok(content(&a.parts));
            }
            Ok(match t.artifacts.as_slice() {
                [] => t
                    .status
                    .message
                    .as_ref()
                    .map(|m| content(&m.parts))
                    .unwrap_or(Value::Null),
                [a] => content(&a.parts),
                many => Value::Array(
                    many.iter()
                        .map(|a| json!({"name": a.name, "output": content(&a.parts)}))
                        .collect(),
                ),
            })
        }
    }
}
