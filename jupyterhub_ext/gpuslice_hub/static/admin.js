// The gpuslice admin panel: reads the service's REST API with the page's XSRF token (cookie
// auth through HubOAuth) and renders each section on its own, so one failing endpoint
// leaves the rest of the panel working. No build step: this file is served as is.
'use strict';

(function () {
  const meta = name => document.querySelector(`meta[name="${name}"]`).content;
  const API = meta('gpuslice-api');
  const XSRF = meta('gpuslice-xsrf');
  const REFRESH_MS = 5000;
  // jobPages: the cursor and first row number of each page shown so far (the last is shown)
  const state = {
    days: 7,
    showFinished: false,
    overview: null,
    suggestions: null,
    jobPages: [{ cursor: null, offset: 0 }]
  };

  // -- plumbing -------------------------------------------------------------------------

  async function api(method, path, body) {
    const init = {
      method,
      credentials: 'same-origin',
      headers: { 'X-XSRFToken': XSRF, Accept: 'application/json' }
    };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(API + path, init);
    if (resp.status === 204) return null;
    let data = null;
    try {
      data = await resp.json();
    } catch {
      data = null;
    }
    if (!resp.ok) {
      const why = (data && data.message) || resp.statusText;
      throw new Error(`${why} (HTTP ${resp.status} from ${method} ${path.split('?')[0]})`);
    }
    return data;
  }

  // Elements are built with textContent only: user names and reasons are never HTML.
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (k === 'className') el.className = v;
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else el.setAttribute(k, v === true ? '' : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function showError(id, err) {
    const el = document.getElementById(id);
    if (!el) return;
    el.hidden = !err;
    el.textContent = err ? String(err.message || err) : '';
  }

  // GPUs to the hundredth, rounded half up from milli-GPU: one rule for every figure (toFixed
  // on the binary fraction rounded 0.285 down and 2.285 up, so a GPU's figures and the
  // summary's disagreed).
  const hundredths = milli => Math.round(milli / 10);
  const inHundredths = n => (n / 100).toFixed(2).replace(/\.?0+$/, '');
  const gpus = milli =>
    milli === null || milli === undefined ? '–' : inHundredths(hundredths(milli));
  const gib = mib =>
    mib === null || mib === undefined ? '–' : (mib / 1024).toFixed(1).replace(/\.0$/, '');
  const pct = v => (v === null || v === undefined ? '–' : `${Math.round(v)}%`);

  function ago(iso) {
    if (!iso) return '–';
    const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    return duration(s) + ' ago';
  }

  function duration(s) {
    if (s === null || s === undefined) return '–';
    if (s < 90) return `${Math.round(s)} s`;
    if (s < 5400) return `${Math.round(s / 60)} min`;
    if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
    return `${(s / 86400).toFixed(1)} d`;
  }

  // Work done or lost, to the second: the rule the lab and the service's job history use
  // (durations.work_span), so the panel and the researcher read the same figure.
  function workSpan(s) {
    if (s === null || s === undefined) return '–';
    const total = Math.max(0, Math.floor(Number(s) || 0));
    const hours = Math.floor(total / 3600);
    const minutes = Math.floor((total % 3600) / 60);
    const pad = n => String(n).padStart(2, '0');
    if (hours) return `${hours}h ${pad(minutes)}m`;
    if (minutes) return `${minutes}m ${pad(total % 60)}s`;
    return `${total % 60}s`;
  }

  const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;
  const when = iso => (iso ? new Date(iso).toLocaleString() : '–');

  // A confirmation dialog that asks for the reason every admin action records.
  function confirmAction(title, text, run, reasonText = '') {
    const dialog = document.getElementById('gs-confirm');
    const reason = document.getElementById('gs-confirm-reason');
    document.getElementById('gs-confirm-title').textContent = title;
    document.getElementById('gs-confirm-text').textContent = text;
    showError('gs-confirm-error', null);
    reason.value = reasonText;
    const ok = document.getElementById('gs-confirm-ok');
    const onClick = async ev => {
      ev.preventDefault();
      if (!reason.value.trim()) {
        showError('gs-confirm-error', 'Say why: the reason is recorded with the action.');
        return;
      }
      ok.disabled = true;
      try {
        await run(reason.value.trim());
        dialog.close();
        await refresh();
      } catch (err) {
        showError('gs-confirm-error', err);
      } finally {
        ok.disabled = false;
      }
    };
    ok.onclick = onClick;
    dialog.showModal();
    reason.focus();
  }

  // -- summary --------------------------------------------------------------------------

  const CARD_DEFINITIONS = {
    capacity: 'The GPUs in service now: drained GPUs are left out.',
    allocated:
      'What the active allocations hold (servers, batch jobs, and holders outside gpuslice).',
    used:
      "What the holders' current usage reports say they use. Allocations without a current " +
      'report are left out, never counted as idle: the note says how much allocation the ' +
      'reports cover.',
    free:
      'Capacity not allocated. Of it, "fragmented" is what no configured profile can use ' +
      'right now (too small a piece of a GPU, an instance no profile asks for, a host with no ' +
      'CPU or memory left).',
    jobs: 'Batch jobs running (or starting, or giving their slices up) and waiting in the queue.',
    reclaimed: "Idle time ended by culling servers, times each slice's share of a GPU.",
    'job-folders':
      "What the batch jobs' folders take on the service's disk (jobs_root), as the last sweep " +
      'measured it: a folder goes once its job ended and its outputs were copied to its ' +
      "owner's folder (after the retention), at once for a job cancelled before it started."
  };

  function renderSummary(ov) {
    const t = ov.totals;
    // allocated and free as the inventory below shows them: its GPUs add up to these
    const shown = inventoryFigures(ov);
    const r = ov.reclaimed_gpu_hours;
    // (each card's definition on hover: the admin guide's "How the figures are made")
    const card = (label, value, note, key) =>
      h(
        'div',
        { className: 'gs-card', dataset: { key }, title: CARD_DEFINITIONS[key] },
        h('div', { className: 'gs-card-value' }, value),
        h('div', { className: 'gs-card-label' }, label),
        note ? h('div', { className: 'gs-card-note' }, note) : null
      );
    const used = t.used_milli === null ? '–' : `${gpus(t.used_milli)} GPUs`;
    document
      .getElementById('gs-summary')
      .replaceChildren(
        card(
          'capacity',
          `${gpus(t.capacity_milli)} GPUs`,
          `${t.gpus} GPUs, ${t.drained_gpus} drained`,
          'capacity'
        ),
        card(
          'allocated',
          `${inHundredths(shown.allocated)} GPUs`,
          plural(t.active_allocations, 'allocation'),
          'allocated'
        ),
        card(
          'utilized',
          used,
          t.used_milli === null
            ? 'no current usage report'
            : `reports cover ${gpus(t.reported_milli)} GPUs`,
          'used'
        ),
        card(
          'free',
          `${inHundredths(shown.free)} GPUs`,
          `${inHundredths(Math.min(hundredths(t.fragmented_milli), shown.free))} fragmented`,
          'free'
        ),
        card('jobs', `${t.running_jobs} running`, `${t.queued_jobs} queued`, 'jobs'),
        card(
          'reclaimed',
          `${r.last_7d.toFixed(1)} GPU-h`,
          `7 days; ${r.last_30d.toFixed(1)} in 30, ${r.total.toFixed(1)} in all`,
          'reclaimed'
        ),
        ...(ov.jobs_root ? [jobFoldersCard(ov.jobs_root, card)] : [])
      );
  }

  function bytesText(n) {
    if (n === null || n === undefined) return 'not measured yet';
    const units = ['bytes', 'KiB', 'MiB', 'GiB', 'TiB'];
    let value = n;
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return unit ? `${value.toFixed(1)} ${units[unit]}` : `${n} bytes`;
  }

  // The jobs root on the service's disk (issue 45: job folders were never removed).
  function jobFoldersCard(root, card) {
    const cap = root.user_cap_bytes ? `, at most ${bytesText(root.user_cap_bytes)} a user` : '';
    return card(
      'job folders',
      bytesText(root.bytes),
      `${plural(root.folders, 'folder')}${cap}; kept ${root.retention_days} d after copy`,
      'job-folders'
    );
  }

  // -- inventory ------------------------------------------------------------------------

  // Each GPU's allocated and free in hundredths of a GPU, made to add up as read: a GPU's
  // two make its own total rounded (1 for a GPU in service; MIG instances are sevenths,
  // counted in whole milli, so seven 1g ones make 0.994: 0.99), and all GPUs' make the
  // summary's cards. Running totals do it: a GPU's total is the rounded sum up to and with
  // it minus the rounded sum before it (so 0.712 allocated and 0.285 free show as 0.71 and
  // 0.29, not 0.71 and 0.28), likewise its allocated, each kept within a hundredth of its
  // own allocated and its free within a hundredth of its own free (nothing free shows 0).
  // The fragmented part of free is never shown as more than free.
  function inventoryFigures(ov) {
    const rows = [];
    let sum = 0;
    let allocatedSum = 0;
    let allocatedShown = 0;
    for (const host of ov.hosts) {
      for (const g of host.gpus) {
        const a = g.allocated_milli;
        const f = g.free_milli;
        const before = hundredths(sum);
        sum += a + f;
        const total = hundredths(sum) - before;
        allocatedSum += a;
        const low = Math.max(Math.floor(a / 10), total - Math.ceil(f / 10));
        const high = Math.min(Math.ceil(a / 10), total - Math.floor(f / 10));
        const allocated = Math.min(high, Math.max(low, hundredths(allocatedSum) - allocatedShown));
        allocatedShown += allocated;
        rows.push({ g, total, low, high, allocated });
      }
    }
    // what the bounds kept a running total from reaching, taken up by GPUs with room
    let left = hundredths(allocatedSum) - allocatedShown;
    for (const row of rows) {
      const step = Math.max(row.low - row.allocated, Math.min(row.high - row.allocated, left));
      row.allocated += step;
      left -= step;
    }
    const gpus = new Map();
    let allocated = 0;
    for (const { g, total, allocated: a } of rows) {
      const free = total - a;
      const fragmented =
        g.fragmented_milli === g.free_milli ? free : Math.min(hundredths(g.fragmented_milli), free);
      gpus.set(g.uuid, { allocated: a, free, fragmented });
      allocated += a;
    }
    return { gpus, allocated, free: hundredths(sum) - allocated };
  }

  function holderText(slice) {
    const who = slice.holder;
    if (!who) return h('span', { className: 'gs-free' }, 'free');
    if (who.purpose === 'external') {
      // held by a Slurm job or Kubernetes pod that did not come through gpuslice: never
      // offered (its profile is "<engine>:<gres>")
      const k8s = String(who.profile || '').startsWith('kubernetes:');
      return h(
        'span',
        { className: 'gs-holder', title: `allocation ${who.allocation_id}` },
        h('b', {}, k8s ? 'Kubernetes' : 'Slurm'),
        ` ${k8s ? 'pod' : 'job'} outside gpuslice · ${who.server_name} · since ${ago(who.since)}`
      );
    }
    const what =
      who.purpose === 'batch' ? `job ${who.job_id ?? '?'}` : who.server_name || 'default server';
    // the latest report, however old (its age says how much it stands for now); a share's
    // figure is of its whole GPU (the admin guide's "How the figures are made")
    const util = who.reported_at
      ? `${pct(who.utilization)} of its GPU busy (reported ${ago(who.reported_at)})`
      : 'no report';
    const idle =
      who.reported_at && who.idle_seconds > 0 ? `, idle ${duration(who.idle_seconds)}` : '';
    return h(
      'span',
      {
        className: 'gs-holder',
        title: `allocation ${who.allocation_id}, since ${when(who.since)}`
      },
      h('b', {}, who.user),
      ` ${what} · ${who.profile} · since ${ago(who.since)} · ${util}${idle}`
    );
  }

  function sliceLabel(s) {
    if (s.kind === 'mig') return `MIG ${s.mig_profile}`;
    if (s.kind === 'gpu') return 'whole GPU';
    const label = `share ${gpus(s.milli)} GPU, ${Math.round(s.memory_mib / 1024)} GiB`;
    return s.charged_memory_mib === null || s.charged_memory_mib === undefined
      ? label
      : `${label} (overcommitted: charged ${gib(s.charged_memory_mib)} GiB)`;
  }

  function renderInventory(ov) {
    const figures = inventoryFigures(ov).gpus;
    const figure = (g, key) => inHundredths(figures.get(g.uuid)[key]);
    const hosts = ov.hosts.map(host =>
      h(
        'div',
        { className: 'gs-host', dataset: { host: host.name } },
        h(
          'h3',
          {},
          host.name,
          host.present ? '' : ' (gone)',
          h(
            'small',
            {},
            ` CPU ${gpus(host.cpu_milli_free)} of ${gpus(host.cpu_milli)} free · memory ${Math.round(host.memory_mib_free / 1024)} of ${Math.round(host.memory_mib / 1024)} GiB free`
          )
        ),
        h(
          'table',
          { className: 'gs-table gs-gpus' },
          h(
            'thead',
            {},
            h(
              'tr',
              {},
              ['GPU', 'model', 'allocated', 'free', 'slices', ''].map(c => h('th', {}, c))
            )
          ),
          h(
            'tbody',
            {},
            host.gpus.map(g =>
              h(
                'tr',
                { dataset: { gpu: g.uuid }, className: g.drained ? 'gs-drained' : '' },
                h(
                  'td',
                  {},
                  `#${g.index}`,
                  g.drained ? h('span', { className: 'gs-badge' }, 'drained') : null,
                  g.present ? null : h('span', { className: 'gs-badge' }, 'gone')
                ),
                h(
                  'td',
                  {},
                  g.model,
                  h(
                    'small',
                    {},
                    ` ${Math.round(g.memory_mib / 1024)} GiB${g.mig_mode === 'enabled' ? ', MIG' : ''}`
                  )
                ),
                h('td', {}, figure(g, 'allocated')),
                h(
                  'td',
                  {},
                  figure(g, 'free'),
                  g.fragmented_milli
                    ? h('small', {}, ` (${figure(g, 'fragmented')} fragmented)`)
                    : null
                ),
                h(
                  'td',
                  {},
                  h(
                    'ul',
                    { className: 'gs-slices' },
                    g.slices.map(s =>
                      h(
                        'li',
                        { dataset: { allocation: s.holder ? s.holder.allocation_id : '' } },
                        h('span', { className: 'gs-slice' }, sliceLabel(s)),
                        ' ',
                        holderText(s)
                      )
                    ),
                    g.slices.length === 0
                      ? h('li', {}, h('span', { className: 'gs-free' }, 'no slices held'))
                      : null
                  )
                ),
                h(
                  'td',
                  {},
                  h(
                    'button',
                    {
                      type: 'button',
                      className: 'gs-drain',
                      onclick: () =>
                        confirmAction(
                          g.drained
                            ? `Undrain GPU #${g.index} of ${host.name}`
                            : `Drain GPU #${g.index} of ${host.name}`,
                          g.drained
                            ? 'New slices may be placed on this GPU again.'
                            : 'No new slices will be placed on this GPU; its current holders keep theirs.',
                          reason =>
                            api('POST', `gpus/${encodeURIComponent(g.uuid)}/drain`, {
                              drained: !g.drained,
                              reason
                            })
                        )
                    },
                    g.drained ? 'Undrain' : 'Drain'
                  )
                )
              )
            )
          )
        )
      )
    );
    document.getElementById('gs-hosts').replaceChildren(...hosts);
  }

  // -- usage plot -----------------------------------------------------------------------

  // Ticks as fine as the span needs: seconds for a young pool, dates for a month.
  /** The round step (1, 2 or 5 × 10^k, at least 0.1) nearest above ``raw``. */
  function niceStep(raw) {
    const power = 10 ** Math.floor(Math.log10(Math.max(raw, 0.1)));
    const mult = [1, 2, 5, 10].find(f => f * power >= raw) ?? 10;
    return Math.max(0.1, mult * power);
  }

  function tickFormat(spanMs) {
    if (spanMs < 2 * 3600 * 1000) {
      return { hour: '2-digit', minute: '2-digit', second: '2-digit' };
    }
    if (spanMs < 2 * 86400 * 1000) {
      return { weekday: 'short', hour: '2-digit', minute: '2-digit' };
    }
    return { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit' };
  }

  function renderPlot(usage) {
    const box = document.getElementById('gs-plot');
    const pts = usage.series;
    if (!pts.length) {
      box.replaceChildren(
        h(
          'p',
          { className: 'gs-help' },
          'No samples yet: the service records one every few minutes.'
        )
      );
      return;
    }
    const W = 900,
      H = 260,
      L = 48,
      R = 12,
      T = 12,
      B = 28;
    // A young pool has samples for only part of the window: plot from the first one.
    const t0 = Math.max(Date.parse(usage.from), Date.parse(pts[0].ts)),
      t1 = Math.max(Date.parse(usage.to), t0 + 1000);
    // The capacity line is what can be handed out: drained GPUs left out (older samples
    // did not record it: the whole capacity).
    const inService = p => p.in_service_milli ?? p.capacity_milli;
    for (const p of pts) p.service_milli = inService(p);
    const top = Math.max(
      1,
      ...pts.map(p => Math.max(p.capacity_milli, p.allocated_milli, p.used_milli || 0))
    );
    // Gridlines at round numbers of GPUs (1, 2, 5 × 10^k), up to five of them.
    const step = Math.round(niceStep(top / 1000 / 4) * 1000);
    const ymax = Math.ceil((top * 1.04) / step) * step;
    const x = iso => L + ((Date.parse(iso) - t0) / (t1 - t0)) * (W - L - R);
    const y = m => T + (1 - m / ymax) * (H - T - B);
    const NS = 'http://www.w3.org/2000/svg';
    const s = (tag, attrs) => {
      const el = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
      return el;
    };
    const line = key => {
      let d = '';
      let pen = false;
      for (const p of pts) {
        const v = p[key];
        if (v === null || v === undefined) {
          pen = false;
          continue;
        }
        d += `${pen ? 'L' : 'M'}${x(p.ts).toFixed(1)},${y(v).toFixed(1)}`;
        pen = true;
      }
      return d;
    };
    const svg = s('svg', {
      viewBox: `0 0 ${W} ${H}`,
      role: 'img',
      'aria-label': 'GPUs allocated and utilized over time'
    });
    for (let m = 0; m <= ymax + step / 2; m += step) {
      svg.append(s('line', { x1: L, x2: W - R, y1: y(m), y2: y(m), class: 'gs-grid' }));
      const label = s('text', {
        x: L - 6,
        y: y(m) + 4,
        class: 'gs-axis gs-axis-y',
        'text-anchor': 'end'
      });
      label.textContent = gpus(m);
      svg.append(label);
    }
    for (let i = 0; i <= 4; i++) {
      const t = t0 + ((t1 - t0) / 4) * i;
      const label = s('text', {
        x: L + ((W - L - R) / 4) * i,
        y: H - 8,
        class: 'gs-axis',
        'text-anchor': i === 0 ? 'start' : i === 4 ? 'end' : 'middle'
      });
      label.textContent = new Date(t).toLocaleString([], tickFormat(t1 - t0));
      svg.append(label);
    }
    const first = pts[0],
      last = pts[pts.length - 1];
    const area =
      `M${x(first.ts)},${y(0)}` +
      line('allocated_milli').replace(/^M/, 'L') +
      `L${x(last.ts)},${y(0)}Z`;
    svg.append(s('path', { d: area, class: 'gs-allocated' }));
    svg.append(s('path', { d: line('service_milli'), class: 'gs-capacity' }));
    svg.append(s('path', { d: line('used_milli'), class: 'gs-used' }));
    // the figures of the last sample, said as such: the summary above is of this moment
    const when = new Date(last.ts).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
    const legend = h(
      'p',
      { className: 'gs-legend' },
      `at the last sample (${when}): `,
      h(
        'span',
        { className: 'gs-key gs-key-capacity' },
        last.service_milli < last.capacity_milli
          ? `in service ${gpus(last.service_milli)} of ${gpus(last.capacity_milli)} GPUs ` +
              `(${gpus(last.capacity_milli - last.service_milli)} drained)`
          : `capacity ${gpus(last.capacity_milli)} GPUs`
      ),
      h(
        'span',
        { className: 'gs-key gs-key-allocated' },
        `allocated ${gpus(last.allocated_milli)}`
      ),
      h('span', { className: 'gs-key gs-key-used' }, `utilized ${gpus(last.used_milli)}`),
      ` · ${pts.length} samples · queued jobs in the last one: ${last.queued_jobs}`
    );
    box.replaceChildren(svg, legend);
  }

  function renderGroups(usage) {
    const rows = usage.groups.map(g =>
      h(
        'tr',
        { dataset: { group: g.group } },
        h('td', {}, g.group),
        h('td', {}, g.gpu_hours_7d.toFixed(2)),
        h('td', {}, g.gpu_hours_30d.toFixed(2)),
        h(
          'td',
          {},
          `${g.interactive_gpu_hours_30d.toFixed(2)} / ${g.batch_gpu_hours_30d.toFixed(2)}`
        ),
        h('td', {}, g.allocations_30d),
        h('td', {}, g.reclaimed_gpu_hours_30d.toFixed(2))
      )
    );
    if (!rows.length) {
      rows.push(h('tr', {}, h('td', { colspan: 6 }, 'No allocations in the last 30 days.')));
    }
    document.querySelector('#gs-groups-table tbody').replaceChildren(...rows);
  }

  // -- jobs -----------------------------------------------------------------------------

  const RUNNING = new Set(['starting', 'running']);
  const FINISHED = new Set(['completed', 'failed', 'cancelled', 'timed-out']);
  const UNFINISHED = 'queued,starting,running,preempting,preempted';
  const JOB_PAGE = 100;

  function jobHistory(job) {
    return h(
      'tr',
      { className: 'gs-history', dataset: { historyFor: job.id } },
      h(
        'td',
        { colspan: 10 },
        h(
          'ol',
          {},
          job.transitions.map(t =>
            h(
              'li',
              { className: t.state === 'preempting' ? 'gs-preempt' : '' },
              `${when(t.at)}: ${t.from || '–'} → ${t.state}`,
              t.reason ? ` (${t.reason})` : ''
            )
          )
        ),
        job.waiting_reason ? h('p', {}, `Waiting: ${job.waiting_reason}`) : null,
        job.error ? h('p', { className: 'gs-error' }, job.error) : null
      )
    );
  }

  // What a preemption will do and cost, said before it is confirmed, from what the service
  // knows: the job's last checkpoint (none, or when) and the grace period. What the job
  // does with the request is its own code's: a loop using gpuslice.checkpoint saves at the
  // end of its current step and exits; other code runs on until it ends or the grace does.
  function preemptWarning(job, now, grace) {
    const starts = (job.transitions || []).filter(t => t.state === 'starting');
    const started = starts.length ? Date.parse(starts[starts.length - 1].at) : NaN;
    const saved = job.last_checkpoint_at ? Date.parse(job.last_checkpoint_at) : NaN;
    const known = grace !== null && grace !== undefined;
    const within = known ? workSpan(grace) : 'its grace period';
    const asked =
      `It is asked to checkpoint and exit within ${within}, and is killed if still running ` +
      'then. If it finishes within that time it completes; otherwise it is requeued. ';
    // What a resume redoes: the work since the later of this run's start and the last save.
    const safe = Number.isNaN(saved)
      ? started
      : Number.isNaN(started)
        ? saved
        : Math.max(saved, started);
    const since = Number.isNaN(safe) ? null : Math.max(0, (now - safe) / 1000);
    const sofar = since === null ? '' : ` ${workSpan(since)} so far,`;
    const most =
      since !== null && known ? ` up to ${workSpan(since + grace)} if it runs` : ' more if it runs';
    const cost = `${sofar}${most} to the end of the grace period`;
    if (Number.isNaN(saved)) {
      return (
        asked +
        'It has no checkpoint: unless it saves one when asked (gpuslice.checkpoint does, at ' +
        `the end of its current step), it starts over and this run's work is lost:${cost}.`
      );
    }
    const before = !Number.isNaN(started) && saved < started ? ', before this run began' : '';
    return (
      asked +
      `Its last checkpoint was saved ${workSpan((now - saved) / 1000)} ago${before}: unless it ` +
      `saves again when asked, it resumes from there and the work since is redone:${cost}.`
    );
  }

  const expanded = new Set();

  function renderJobs(jobs) {
    const rows = [];
    for (const job of jobs) {
      if (!state.showFinished && FINISHED.has(job.state)) continue;
      const actions = [];
      if (RUNNING.has(job.state)) {
        actions.push(
          h(
            'button',
            {
              type: 'button',
              className: 'gs-preempt-btn',
              onclick: () =>
                confirmAction(
                  `Preempt job ${job.id} (${job.name}) of ${job.user}`,
                  preemptWarning(job, Date.now(), state.preemptGrace),
                  reason => api('POST', `jobs/${job.id}/preempt`, { reason })
                )
            },
            'Preempt'
          )
        );
      }
      if (!FINISHED.has(job.state)) {
        actions.push(
          h(
            'button',
            {
              type: 'button',
              className: 'gs-cancel-btn',
              onclick: () =>
                confirmAction(
                  `Cancel job ${job.id} (${job.name}) of ${job.user}`,
                  'The job is stopped for good; its slices go back to the pool.',
                  reason => api('DELETE', `jobs/${job.id}`, { reason })
                )
            },
            'Cancel'
          )
        );
      }
      const toggle = () => {
        if (expanded.has(job.id)) expanded.delete(job.id);
        else expanded.add(job.id);
        renderJobs(jobs);
      };
      rows.push(
        h(
          'tr',
          { dataset: { jobId: job.id, state: job.state } },
          h(
            'td',
            {},
            h(
              'button',
              {
                type: 'button',
                className: 'gs-link',
                onclick: toggle,
                'aria-expanded': expanded.has(job.id) ? 'true' : 'false'
              },
              `${job.id} ${job.name}`
            )
          ),
          h('td', {}, job.user),
          h(
            'td',
            {},
            `${job.profile}${job.slices > 1 ? ` ×${job.slices}` : ''} · ${job.priority}` +
              (job.time_window ? ` · window ${job.time_window}` : '') +
              (job.on_burst ? ' · in the burst partition' : job.burstable ? ' · burstable' : '') +
              (job.burst_gpu_hours ? ` · ${job.burst_gpu_hours.toFixed(2)} GPU-h bought` : '')
          ),
          h(
            'td',
            {},
            h('span', { className: `gs-state gs-state-${job.state}` }, job.state),
            job.queue_position ? ` #${job.queue_position}` : ''
          ),
          h('td', {}, job.cells_total ? `${job.cells_done} / ${job.cells_total} cells` : '–'),
          h('td', {}, job.restarts),
          h('td', {}, job.preemptions),
          h('td', {}, workSpan(job.lost_work_seconds)),
          h('td', {}, ago(job.submitted_at)),
          h('td', { className: 'gs-actions' }, actions)
        )
      );
      if (expanded.has(job.id)) rows.push(jobHistory(job));
    }
    if (!rows.length) {
      rows.push(
        h(
          'tr',
          {},
          h('td', { colspan: 10 }, state.showFinished ? 'No jobs.' : 'No queued or running jobs.')
        )
      );
    }
    document.querySelector('#gs-jobs-table tbody').replaceChildren(...rows);
  }

  function renderJobPager(reply) {
    const page = state.jobPages[state.jobPages.length - 1];
    const first = reply.jobs.length ? page.offset + 1 : 0;
    document.getElementById('gs-jobs-range').textContent =
      `${first}–${page.offset + reply.jobs.length} of ${reply.total}` +
      (state.showFinished ? ', newest first' : ', in the order they run');
    document.getElementById('gs-jobs-prev').disabled = state.jobPages.length < 2;
    const next = document.getElementById('gs-jobs-next');
    next.disabled = reply.next === null;
    next.onclick = () => {
      state.jobPages.push({ cursor: reply.next, offset: page.offset + reply.jobs.length });
      refresh();
    };
  }

  function jobsQuery() {
    const { cursor } = state.jobPages[state.jobPages.length - 1];
    const which = state.showFinished ? 'order=newest' : `order=run&state=${UNFINISHED}`;
    return `jobs?${which}&limit=${JOB_PAGE}` + (cursor === null ? '' : `&cursor=${cursor}`);
  }

  // -- quotas and exemptions --------------------------------------------------------------

  function limitText(limit) {
    if (!limit) return 'no limit';
    const parts = [];
    if (limit.max_slices !== null && limit.max_slices !== undefined) {
      parts.push(plural(limit.max_slices, 'slice'));
    }
    if (limit.max_milli !== null && limit.max_milli !== undefined) {
      parts.push(`${gpus(limit.max_milli)} ${limit.max_milli === 1000 ? 'GPU' : 'GPUs'}`);
    }
    if (limit.borrow_from && limit.borrow_from.length) {
      parts.push(`borrows from ${limit.borrow_from.join(', ')}`);
    }
    return parts.length ? parts.join(', ') : 'no limit';
  }

  function renderQuotas(q) {
    const overrides = new Map(q.overrides.map(o => [`${o.subject}:${o.name}`, o]));
    const subjects = [['default_user', '', 'every user (default)']];
    for (const u of new Set([...Object.keys(q.effective.users), ...Object.keys(q.in_use.users)])) {
      subjects.push(['user', u, `user ${u}`]);
    }
    for (const g of Object.keys(q.effective.groups)) subjects.push(['group', g, `group ${g}`]);
    const rows = subjects.map(([subject, name, label]) => {
      // A user without a quota of their own has the default user quota.
      const limit = (set, which) => {
        if (subject === 'default_user') {
          return limitText(set.default_user);
        }
        const own = set[`${subject}s`][name];
        if (own || subject === 'group') {
          return limitText(own);
        }
        return `default (${limitText(which.default_user)})`;
      };
      const cfg = limit(q.config, q.config);
      const now = limit(q.effective, q.effective);
      const used =
        subject === 'user'
          ? q.in_use.users[name]
          : subject === 'group'
            ? q.in_use.groups[name]
            : null;
      const o = overrides.get(`${subject}:${name}`);
      const path =
        subject === 'default_user'
          ? 'admin/quotas/default_user'
          : `admin/quotas/${subject}/${encodeURIComponent(name)}`;
      return h(
        'tr',
        { dataset: { subject, name } },
        h('td', {}, label),
        h('td', {}, cfg),
        h('td', {}, now, o ? h('span', { className: 'gs-badge' }, 'changed') : null),
        h('td', {}, used ? `${plural(used.slices, 'slice')}, ${gpus(used.milli)} GPUs` : '–'),
        h('td', {}, o ? `${o.set_by}, ${ago(o.set_at)}: ${o.reason}` : '–'),
        h(
          'td',
          {},
          o
            ? h(
                'button',
                {
                  type: 'button',
                  onclick: () =>
                    confirmAction(
                      `Reset the quota of ${label}`,
                      'Back to the configured limit.',
                      async reason => {
                        await api('DELETE', path, { reason });
                        await loadSuggestions();
                      }
                    )
                },
                'Reset'
              )
            : null
        )
      );
    });
    document.querySelector('#gs-quotas-table tbody').replaceChildren(...rows);
  }

  // Suggestions that would change the quota in force; applying one is an ordinary quota
  // change (PUT, with a reason that says where the figures came from). Users and groups
  // without a quota are listed only on request: on a hub without quotas that is everyone.
  const CHANGE = { lower: 'lowers', raise: 'raises', new: 'sets a first quota' };
  function renderSuggestions(view) {
    state.suggestions = view;
    const all = document.getElementById('gs-suggestions-all').checked;
    const offered = view.suggestions.filter(r => r.suggested && r.change !== 'same');
    const shown = offered.filter(r => all || r.current);
    document.getElementById('gs-suggestion-rule').textContent =
      `A suggestion is ${view.rule}, on the limits the quota in force sets (both for a first ` +
      `quota); nothing is suggested for who held nothing. ${offered.length} would change.`;
    const rows = shown.map(r => {
      const label = `${r.subject} ${r.name}`;
      const peak = `${plural(r.peak_slices, 'slice')}, ${gpus(r.peak_milli)} GPUs`;
      const now = r.current_is_default ? `default (${limitText(r.current)})` : limitText(r.current);
      const path = `admin/quotas/${r.subject}/${encodeURIComponent(r.name)}`;
      const body = {};
      for (const k of ['max_slices', 'max_milli']) {
        if (r.suggested[k] !== null) body[k] = r.suggested[k];
      }
      const lost = r.no_longer_fits.length
        ? ` Not even one ${r.no_longer_fits.join(', ')} would fit any more.`
        : '';
      const apply = () =>
        confirmAction(
          `Apply the suggested quota of ${label}`,
          `${limitText(r.suggested)} (now ${now}).${lost}`,
          async reason => {
            await api('PUT', path, { ...body, reason });
            await loadSuggestions();
          },
          `suggested from history: most held at once ${peak}; ${view.rule}`
        );
      return h(
        'tr',
        { dataset: { subject: r.subject, name: r.name, change: r.change } },
        h('td', {}, label),
        h('td', {}, peak),
        h(
          'td',
          {},
          limitText(r.suggested),
          h('span', { className: 'gs-badge' }, CHANGE[r.change] || r.change),
          lost ? h('div', { className: 'gs-warn' }, lost.trim()) : null
        ),
        h('td', {}, now),
        h('td', {}, h('button', { type: 'button', onclick: apply }, 'Apply'))
      );
    });
    if (!rows.length) {
      rows.push(h('tr', {}, h('td', { colspan: 5 }, 'No quota in force would change.')));
    }
    document.querySelector('#gs-suggestions-table tbody').replaceChildren(...rows);
  }

  // -- the split pools --------------------------------------------------------------------

  function renderPools(split) {
    // the section shows only on a cluster split into pools
    document.getElementById('gs-pools').hidden = !split.pools.length;
    const b = split.borrowing;
    document.getElementById('gs-borrowing').textContent = !b
      ? 'Batch jobs never borrow the reserved pools (no reserved_pool_borrowing).'
      : b.open
        ? `Borrowing window ${b.text} is open: preemptible jobs may borrow until ${when(b.closes_at)}.`
        : `Borrowing window ${b.text} is closed; it opens ${when(b.opens_at)}.`;
    const rows = split.pools.map(p => {
      const what = p.reserved
        ? `reserved: ${[...p.hosts, ...p.listed_gpus].join(', ')}` +
          (p.groups.length ? ` for ${p.groups.join(', ')}` : '')
        : 'every GPU in no reserved pool';
      return h(
        'tr',
        { dataset: { pool: p.name } },
        h('th', { scope: 'row' }, h('b', {}, p.name), h('div', { className: 'gs-help' }, what)),
        h('td', {}, `${p.gpus}` + (p.drained_gpus ? ` (${p.drained_gpus} drained)` : '')),
        h('td', {}, gpus(p.interactive_milli)),
        h('td', {}, gpus(p.batch_milli)),
        h('td', {}, gpus(p.borrowed_milli)),
        h('td', {}, gpus(p.external_milli)),
        h('td', {}, gpus(p.free_milli))
      );
    });
    document.querySelector('#gs-pools-table tbody').replaceChildren(...rows);
  }

  // -- overcommit -------------------------------------------------------------------------

  function renderOvercommit(view) {
    // the section shows only where shares are overcommitted
    document.getElementById('gs-overcommit').hidden = !view.settings.enabled;
    const s = view.settings;
    const t = view.totals;
    const c = view.cost;
    document.getElementById('gs-overcommit-summary').textContent =
      `Up to ${s.ratio}× a GPU's memory in caps; a holder is charged their peak × ${s.headroom} ` +
      `over ${s.days} days once they have held the profile ${s.min_hours} hours. Now: ` +
      `${t.overcommitted_shares} overcommitted shares on ${t.gpus} GPUs, ` +
      `${gib(t.promised_beyond_memory_mib)} GiB promised beyond those GPUs' memory. ` +
      `Last ${c.days} days: ${c.overcommitted_allocations} overcommitted allocations, ` +
      `${c.memory_warnings} memory-cap warnings, ${c.memory_culled} kernels stopped at their cap ` +
      "(peaks and memory-cap events as the holders' own servers report them).";
    const rows = view.gpus.map(g =>
      h(
        'tr',
        { dataset: { gpu: g.gpu_uuid } },
        h('th', { scope: 'row' }, `${g.host} #${g.gpu_index}`),
        h('td', {}, `${gib(g.memory_mib)} GiB`),
        h('td', {}, `${gib(g.promised_memory_mib)} GiB`),
        h('td', {}, `${gib(g.charged_memory_mib)} GiB`),
        h('td', {}, g.in_use_memory_mib === null ? 'no report' : `${gib(g.in_use_memory_mib)} GiB`),
        h(
          'td',
          {},
          g.holders
            .map(
              x =>
                `${x.user} (${x.profile}` +
                (x.charged_memory_mib === null
                  ? ''
                  : `, charged ${gib(x.charged_memory_mib)} GiB`) +
                (x.memory_mib === null ? '' : `, using ${gib(x.memory_mib)} GiB`) +
                ')'
            )
            .join('; ')
        )
      )
    );
    if (!rows.length) {
      rows.push(h('tr', {}, h('td', { colspan: 6 }, 'No share is overcommitted now.')));
    }
    document.querySelector('#gs-overcommit-table tbody').replaceChildren(...rows);
    const next = view.next_charges.map(n =>
      h(
        'tr',
        { dataset: { user: n.user, profile: n.profile, purpose: n.purpose } },
        h('td', {}, n.user),
        h('td', {}, n.purpose === 'batch' ? `${n.profile} (batch jobs)` : n.profile),
        h('td', {}, `${gib(n.cap_memory_mib)} GiB`),
        h('td', {}, `${gib(n.peak_memory_mib)} GiB`),
        h('td', {}, `${n.hours}`),
        h('td', {}, `${Math.round(n.charge * 100)}% of the share`)
      )
    );
    if (!next.length) {
      next.push(h('tr', {}, h('td', { colspan: 6 }, 'Nobody has the history to be charged less.')));
    }
    document.querySelector('#gs-overcommit-next tbody').replaceChildren(...next);
  }

  // -- the capacity check -----------------------------------------------------------------

  function renderCapacity(check) {
    const items = check.verdicts.map(v => h('li', { dataset: { verdict: v.code } }, v.text));
    document.getElementById('gs-verdicts').replaceChildren(...items);
    const ratio = v => (v === null || v === undefined ? '–' : pct(100 * v));
    const figures = [
      ['allocated (of all GPUs, drained included)', w => ratio(w.allocation_rate)],
      [
        'effectively used (of all GPUs)',
        w =>
          w.effective_utilization === null
            ? '– (no usage reports)'
            : `${ratio(w.effective_utilization)}` +
              (w.reported_share !== null && w.reported_share < 1
                ? ` (at least: reports covered ${ratio(w.reported_share)} of the allocation)`
                : '')
      ],
      ['busy, of what usage reports cover', w => ratio(w.busy_share)],
      [
        'usage samples',
        w =>
          `${w.samples} over ${w.history_days} days` +
          (w.use_known_share !== null && w.use_known_share < 1
            ? ` (${ratio(w.use_known_share)} with use known)`
            : '')
      ],
      [
        'batch jobs submitted / completed',
        w =>
          `${w.jobs_submitted} / ${w.jobs_completed}` +
          (w.jobs_in_time_windows ? ` (+${w.jobs_in_time_windows} in time windows)` : '')
      ],
      ['median queue time', w => duration(w.median_queue_seconds)],
      ['median run time', w => duration(w.median_run_seconds)],
      ['queue time / run time', w => ratio(w.queue_to_run)]
    ];
    const rows = figures.map(([label, f]) =>
      h('tr', {}, h('th', { scope: 'row' }, label), ...check.windows.map(w => h('td', {}, f(w))))
    );
    document.querySelector('#gs-capacity-table tbody').replaceChildren(...rows);
  }

  function renderExemptions(ex) {
    const items = ex.exemptions.map(e =>
      h(
        'li',
        { dataset: { user: e.user } },
        h('b', {}, e.user),
        ` — ${e.reason} (by ${e.set_by}, ${ago(e.set_at)}${e.expires_at ? `, until ${when(e.expires_at)}` : ''}) `,
        h(
          'button',
          {
            type: 'button',
            onclick: () =>
              confirmAction(
                `End the idle exemption of ${e.user}`,
                'Their idle sessions are culled again under the normal policy.',
                reason =>
                  api('DELETE', `admin/exemptions/${encodeURIComponent(e.user)}`, { reason })
              )
          },
          'End'
        )
      )
    );
    const c = ex.config;
    const fromConfig = [
      ...c.users.map(u => `user ${u}`),
      ...c.groups.map(g => `group ${g}`),
      ...c.profiles.map(p => `profile ${p}`)
    ];
    if (fromConfig.length) {
      items.push(
        h('li', { className: 'gs-help' }, `From the config file: ${fromConfig.join(', ')}`)
      );
    }
    if (!items.length) items.push(h('li', { className: 'gs-help' }, 'Nobody is exempt.'));
    document.getElementById('gs-exemption-list').replaceChildren(...items);
  }

  function renderActions(data) {
    const rows = data.actions.map(a => {
      const d = a.detail || {};
      const target =
        d.job_id !== undefined
          ? `job ${d.job_id}${a.user ? ` of ${a.user}` : ''}`
          : d.gpu
            ? d.host !== undefined
              ? `GPU ${d.index} on ${d.host} (${d.gpu})`
              : d.gpu
            : d.subject
              ? `${d.subject} ${d.name || ''}`.trim()
              : a.user || '';
      return h(
        'tr',
        { dataset: { kind: a.kind } },
        h('td', {}, when(a.ts)),
        h('td', {}, a.actor || '–'),
        h('td', {}, a.kind),
        h('td', {}, target),
        h('td', {}, a.reason || '')
      );
    });
    if (!rows.length) rows.push(h('tr', {}, h('td', { colspan: 5 }, 'No admin actions yet.')));
    document.querySelector('#gs-actions-table tbody').replaceChildren(...rows);
  }

  // -- forms ----------------------------------------------------------------------------

  // A form's number, null when empty. The bounds are the service's own, said in the field's
  // words: a value the form lets through is not then refused in other terms.
  // ``scale``: the service counts the value in 1/scale units (milli-GPUs), so a value finer
  // than that (0.0004 GPUs) is refused, not rounded (to 0, a quota of nothing).
  // ``whole``: a count (slices).
  function number(form, name, { label, scale, whole, empty = 'no limit', above, max } = {}) {
    const raw = form.elements[name].value.trim();
    if (raw === '') return null;
    const v = Number(raw);
    const low = above === undefined ? v >= 0 : v > above;
    if (!Number.isFinite(v) || !low || (max !== undefined && v > max)) {
      const range = above === undefined ? '≥ 0' : `more than ${above}`;
      const top = max === undefined ? '' : ` and at most ${max}`;
      throw new Error(`${label} must be a number ${range}${top} (empty: ${empty})`);
    }
    if (whole && !Number.isInteger(v)) throw new Error(`${label} must be a whole number`);
    if (scale) {
      const units = v * scale;
      if (Math.abs(units - Math.round(units)) > 1e-6) {
        throw new Error(`${label} must be a multiple of ${1 / scale} (got ${raw})`);
      }
      return Math.round(units);
    }
    return v;
  }

  function wireForms() {
    const quota = document.getElementById('gs-quota-form');
    const quotaError = quota.querySelector('.gs-error');
    quota.elements.subject.addEventListener('change', () => {
      quota.elements.name.disabled = quota.elements.subject.value === 'default_user';
    });
    // an error stays until the form changes (the browser's own checks may stop a submit
    // before this code runs, and would leave the last error beside theirs)
    quota.addEventListener('input', () => {
      quotaError.hidden = true;
    });
    quota.addEventListener('submit', async ev => {
      ev.preventDefault();
      quotaError.hidden = true;
      try {
        const subject = quota.elements.subject.value;
        const name = quota.elements.name.value.trim();
        if (subject !== 'default_user' && !name) throw new Error(`Name the ${subject}.`);
        const body = {
          max_slices: number(quota, 'max_slices', { label: 'max slices', whole: true }),
          max_milli: number(quota, 'max_gpus', { label: 'max GPUs', scale: 1000 }),
          reason: quota.elements.reason.value.trim()
        };
        const path =
          subject === 'default_user'
            ? 'admin/quotas/default_user'
            : `admin/quotas/${subject}/${encodeURIComponent(name)}`;
        await api('PUT', path, body);
        quota.reset();
        await Promise.all([refresh(), loadSuggestions()]);
      } catch (err) {
        quotaError.hidden = false;
        quotaError.textContent = err.message;
      }
    });
    document.getElementById('gs-suggestions-all').addEventListener('change', () => {
      if (state.suggestions) renderSuggestions(state.suggestions);
    });
    const exempt = document.getElementById('gs-exempt-form');
    const exemptError = exempt.querySelector('.gs-error');
    exempt.addEventListener('input', () => {
      exemptError.hidden = true;
    });
    exempt.addEventListener('submit', async ev => {
      ev.preventDefault();
      exemptError.hidden = true;
      try {
        const user = exempt.elements.user.value.trim();
        // (as the service checks it: an exemption of 0 hours is none)
        const hours = number(exempt, 'hours', {
          label: 'hours',
          empty: 'until ended',
          above: 0,
          max: 8760
        });
        const body = { reason: exempt.elements.reason.value.trim() };
        if (hours !== null) body.hours = hours;
        await api('PUT', `admin/exemptions/${encodeURIComponent(user)}`, body);
        exempt.reset();
        await refresh();
      } catch (err) {
        exemptError.hidden = false;
        exemptError.textContent = err.message;
      }
    });
    for (const b of document.querySelectorAll('.gs-window button')) {
      b.addEventListener('click', () => {
        state.days = Number(b.dataset.days);
        for (const o of document.querySelectorAll('.gs-window button')) {
          o.classList.toggle('gs-on', o === b);
        }
        loadUsage();
      });
    }
    document.getElementById('gs-jobs-finished').addEventListener('change', ev => {
      state.showFinished = ev.target.checked;
      state.jobPages = [{ cursor: null, offset: 0 }];
      refresh();
    });
    document.getElementById('gs-jobs-prev').addEventListener('click', () => {
      if (state.jobPages.length > 1) state.jobPages.pop();
      refresh();
    });
  }

  // -- loading --------------------------------------------------------------------------

  async function section(errorId, load) {
    try {
      await load();
      showError(errorId, null);
    } catch (err) {
      showError(errorId, err);
    }
  }

  // The slow-moving views over history: every minute, not every refresh.
  async function loadUsage() {
    await Promise.all([
      section('gs-usage-error', async () => {
        const usage = await api('GET', `admin/usage?days=${state.days}`);
        renderPlot(usage);
        renderGroups(usage);
      }),
      section('gs-capacity-error', async () => renderCapacity(await api('GET', 'admin/capacity'))),
      loadSuggestions()
    ]);
  }

  async function loadSuggestions() {
    await section('gs-suggestions-error', async () =>
      renderSuggestions(await api('GET', 'admin/quota-suggestions'))
    );
  }

  let lastJobs = [];
  async function refresh() {
    await Promise.all([
      section('gs-inventory-error', async () => {
        const ov = await api('GET', 'admin/overview');
        state.overview = ov;
        renderSummary(ov);
        renderInventory(ov);
      }),
      section('gs-jobs-error', async () => {
        const reply = await api('GET', jobsQuery());
        lastJobs = reply.jobs;
        state.preemptGrace = reply.preempt_grace;
        renderJobs(lastJobs);
        renderJobPager(reply);
      }),
      section('gs-quotas-error', async () => renderQuotas(await api('GET', 'admin/quotas'))),
      section('gs-pools-error', async () => renderPools(await api('GET', 'admin/pools'))),
      section('gs-overcommit-error', async () =>
        renderOvercommit(await api('GET', 'admin/overcommit'))
      ),
      section('gs-exemptions-error', async () =>
        renderExemptions(await api('GET', 'admin/exemptions'))
      ),
      section('gs-actions-error', async () =>
        renderActions(await api('GET', 'admin/actions?limit=50'))
      )
    ]);
    document.getElementById('gs-refreshed').textContent =
      `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.loaded = 'true';
  }

  wireForms();
  refresh();
  loadUsage();
  setInterval(() => {
    if (!document.hidden && !document.getElementById('gs-confirm').open) refresh();
  }, REFRESH_MS);
  setInterval(() => {
    if (!document.hidden) loadUsage();
  }, 60000);
})();
