// The postbox console: one page per hash route, each drawn from the
// operator API. Every call it makes is bounded (a page of items, the
// sampler's last minutes), so a page costs the same with a million events
// stored as with ten.

import { api, q, forget, token, APIError } from './api.js';
import { lineChart, fmt } from './chart.js';
import { eventPages, eventHref, deliveriesTable } from './events.js';
import { stuck, delivery, newSubscription, subscription, itemActions, replyTable, discardButtons } from './operate.js';

const root = document.getElementById('view');

// h makes an element: h('td', {class: 'num'}, 'text', child, …). Text is
// always text (never parsed as HTML): payloads and errors are data.
export function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'class') e.className = v;
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else if (k === 'value') e.value = v;
    else if (k === 'checked') e.checked = v;
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// time shows an RFC 3339 time as YYYY-MM-DD HH:MM:SS (UTC).
export function time(s) {
  if (!s) return '–';
  const d = new Date(s);
  if (Number.isNaN(+d)) return s;
  return d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

// put replaces the children of el with parts, leaving out the empty ones.
export function put(el, ...parts) { el.replaceChildren(...parts.flat().filter((p) => p !== null && p !== undefined && p !== false)); }

export function state(s) { return h('span', { class: 'state state-' + s }, s); }

export function table(id, head, rows, empty = 'Nothing here.') {
  if (!rows.length) return h('p', { id, class: 'muted' }, empty);
  return h('div', { class: 'scroll' }, h('table', { id },
    h('thead', {}, h('tr', {}, head.map((c) => (typeof c === 'string' ? h('th', {}, c) : c)))),
    h('tbody', {}, rows)));
}

// currentError is an item's last error while it still stands: none once
// the item completed after it (last_error_past), which shows as history.
export function currentError(it) { return it.last_error_past ? '' : it.last_error || ''; }

export function num(v) { return h('td', { class: 'num' }, v === null || v === undefined ? '–' : String(v)); }

export function errorBox(err) {
  return h('p', { class: 'error', role: 'alert' }, err instanceof APIError ? `${err.status} ${err.code || ''}: ${err.message}` : String(err));
}

// confirmDialog asks text and resolves true when the operator confirms.
export function confirmDialog(text, ok = 'Replay') {
  const dlg = document.getElementById('confirm-dialog');
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = ok;
  dlg.returnValue = '';
  return new Promise((resolve) => {
    dlg.addEventListener('close', () => resolve(dlg.returnValue === 'ok'), { once: true });
    dlg.showModal();
  });
}

// ---- overview ------------------------------------------------------------

function points(samples, key) { return samples.map((s) => [new Date(s.at), s[key]]); }

async function overview(live) {
  const { view } = live;
  const draw = async () => {
    const [health, stats, stuckParts] = await Promise.all([
      fetch('/health', { cache: 'no-store' }).then((r) => r.json()).catch(() => ({})),
      api('/v1/stats'),
      stuck(),
    ]);
    const s = stats.samples;
    const last = s.length ? s[s.length - 1] : {};
    const t = stats.totals;
    document.getElementById('version').textContent = health.version ? 'postbox ' + health.version : '';
    return [
      h('h1', {}, 'Overview'),
      h('p', { class: 'muted' }, `A sample every ${stats.interval}` +
        (s.length > 1 ? ` over the last ${Math.max(1, Math.round((new Date(last.at) - new Date(s[0].at)) / 60000))} min` : '') +
        `; totals since the server started, ${time(stats.since)}.`),
      h('div', { class: 'tiles', id: 'tiles' },
        tile('Events stored', t.stored, 'stored'), tile('Refused', t.refused, 'refused'),
        tile('Delivered', t.completed, 'completed'), tile('Failed attempts', t.failed_attempts, 'failed'),
        tile('Dead-lettered', t.dead_lettered, 'dead'),
        tile('Writer queue', `${last.queue_depth ?? 0} / ${last.queue_capacity ?? '–'}`, 'queue')),
      ...stuckParts,
      h('h2', {}, 'Last minutes'),
      h('div', { class: 'grid', id: 'charts' },
        lineChart('Ingest (events/s)', [
          { name: 'stored', points: points(s, 'ingest_rate') },
          { name: 'refused', points: points(s, 'refused_rate') }], '/s'),
        lineChart(`Writer queue depth (capacity ${last.queue_capacity ?? '–'})`, [
          { name: 'queued', points: points(s, 'queue_depth') }]),
        lineChart('Group commit latency (mean)', [
          { name: 'commit', points: points(s, 'commit_latency_ms') }], 'ms'),
        lineChart('Deliveries (items/s)', [
          { name: 'completed', points: points(s, 'delivery_rate') },
          { name: 'failed attempts', points: points(s, 'failure_rate') },
          { name: 'dead-lettered', points: points(s, 'dead_letter_rate') }], '/s')),
    ];
  };
  const render = async () => put(view, ...(await draw()));
  await render();
  live.every(5000, render);
}

function tile(name, v, id) {
  return h('div', { class: 'tile', dataset: { tile: id } }, h('span', { class: 'muted' }, name), h('b', {}, typeof v === 'number' ? fmt(v) : v));
}

// ---- sources and streams ------------------------------------------------

async function streams(live) {
  const { view } = live;
  const [src, st] = await Promise.all([api('/v1/sources'), api('/v1/streams')]);
  put(view,
    h('h1', {}, 'Sources & streams'),
    h('h2', {}, 'Sources'),
    table('sources-table', ['Name', 'Kind', 'Stream', 'Signature', 'Intake', 'Created'],
      src.sources.map((s) => h('tr', { dataset: { name: s.name } },
        h('td', {}, s.name), h('td', {}, s.kind), h('td', {}, s.stream),
        h('td', {}, (s.settings && s.settings.signature) || '–'), h('td', {}, s.path || '–'),
        h('td', {}, time(s.created_at))))),
    h('h2', {}, 'Streams'),
    table('streams-table', ['Stream', 'Source', 'Backend', h('th', { class: 'num' }, 'Events'),
      h('th', { class: 'num' }, 'First offset'), h('th', { class: 'num' }, 'Last offset'), 'First stored', 'Last stored'],
    st.streams.map((s) => h('tr', { dataset: { name: s.stream } },
      h('td', {}, h('a', { href: `#/stream/${encodeURIComponent(s.stream)}` }, s.stream)), h('td', {}, s.source || '–'), h('td', {}, s.backend),
      num(s.events), num(s.first_offset), num(s.last_offset),
      h('td', {}, time(s.first_stored_at)), h('td', {}, time(s.last_stored_at))))),
  );
}

// ---- subscriptions -------------------------------------------------------

async function subscriptions(live) {
  const { view } = live;
  const top = h('div', {}); // redrawn every 5 s
  const replays = h('div', { id: 'replays' }); // not redrawn: it holds a form
  put(view, h('h1', {}, 'Subscriptions'), top, replays);
  const render = async () => {
    const [subs, stats] = await Promise.all([api('/v1/subscriptions'), api('/v1/stats')]);
    const list = subs.subscriptions;
    // Item counts: the subscription's own when the server keeps them, else its inbox's.
    const inboxes = list.every((s) => s.counts) ? new Map() : new Map((await api('/v1/inboxes')).inboxes.map((i) => [i.inbox, i]));
    const countOf = (s) => s.counts || inboxes.get(s.inbox) || {};
    const lagging = [...list].sort((a, b) => b.lag - a.lag).slice(0, 6);
    const series = lagging.map((s) => ({
      name: s.name,
      points: stats.samples.filter((p) => p.lag && s.name in p.lag).map((p) => [new Date(p.at), p.lag[s.name]]),
    }));
    put(top,
      h('div', { class: 'grid' }, lineChart('Lag (events not yet consumed)', series)),
      h('h2', {}, 'Subscriptions and their endpoints'),
      h('div', { class: 'actions' }, h('a', { href: '#/new-subscription', id: 'new-subscription', class: 'button' }, 'New subscription')),
      table('subscriptions-table', ['Name', 'Source', 'Inbox', 'Types', 'Endpoint', 'Delivery', 'Breaker',
        h('th', { class: 'num' }, 'Pending'), h('th', { class: 'num' }, 'Dead letters'),
        h('th', { class: 'num' }, 'Lag'), h('th', { class: 'num' }, 'Next offset'), h('th', { class: 'num' }, 'High watermark')],
      list.map((s) => h('tr', { dataset: { name: s.name, paused: String(!!s.paused) } },
        h('td', {}, h('a', { href: '#/subscription/' + encodeURIComponent(s.name) }, s.name)), h('td', {}, s.source),
        h('td', {}, h('a', { href: '#/inbox' + q({ inbox: s.inbox }) }, s.inbox)),
        h('td', {}, s.types && s.types.length ? s.types.join(', ') : 'all'),
        h('td', { class: 'clip', title: s.target || '' }, s.target || 'runtime (lease/ack)'),
        h('td', { class: 'delivery' }, delivery(s, render)),
        h('td', {}, breaker(s, render)),
        num(countOf(s).pending), h('td', { class: 'num' }, countOf(s).failed
          ? h('a', { href: '#/dead-letters' + q({ subscription: s.name }) }, String(countOf(s).failed)) : String(countOf(s).failed ?? '–')),
        num(s.lag), num(s.next_offset), num(s.high_watermark))), 'No subscriptions.'),
    );
    return list;
  };
  const list = await render();
  replayForm(live, replays, list);
  live.every(5000, render);
}

// replayForm is the form that replays a subscription's items of a time
// range (completed and failed ones: a replay job of the server), with the
// job's progress.
function replayForm(live, box, list) {
  if (!list.length) return;
  const progress = h('div', { id: 'range-progress', class: 'card', hidden: true });
  const form = h('form', { class: 'filters', id: 'range-form' },
    h('label', {}, 'Subscription', h('select', { name: 'subscription' }, list.map((s) => h('option', { value: s.name }, s.name)))),
    h('label', {}, 'Items that reached the inbox from', h('input', { type: 'datetime-local', name: 'since', required: true })),
    h('label', {}, 'until (empty: now)', h('input', { type: 'datetime-local', name: 'until' })),
    h('label', {}, 'States', h('select', { name: 'states' },
      h('option', { value: 'completed,failed' }, 'completed and failed'),
      h('option', { value: 'completed' }, 'completed'), h('option', { value: 'failed' }, 'failed'))),
    h('button', { type: 'submit', class: 'danger' }, 'Replay range…'));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const f = new FormData(form);
    const name = f.get('subscription');
    const body = { since: toRFC3339(f.get('since')), states: f.get('states').split(',') };
    if (f.get('until')) body.until = toRFC3339(f.get('until'));
    if (!(await confirmDialog(`Deliver again every ${body.states.join(' and ')} item of ${name} that reached its inbox from ` +
      `${time(body.since)} until ${body.until ? time(body.until) : 'now'}?`))) return;
    progress.hidden = false;
    try {
      let job = await api(`/v1/subscriptions/${encodeURIComponent(name)}/replay`, { method: 'POST', body });
      const bar = h('progress', { max: Math.max(job.matched, 1), value: job.replayed });
      const text = h('p', { id: 'range-status' });
      const show = () => {
        bar.max = Math.max(job.matched, 1);
        bar.value = job.replayed;
        text.textContent = `Replay ${job.id}: ${job.state}, ${job.replayed} of ${job.matched} items back to pending` +
          (job.error ? ` (${job.error})` : '') + '.';
        text.dataset.state = job.state;
      };
      put(progress, text, bar);
      show();
      const stop = live.every(1000, async () => {
        job = await api(`/v1/replays/${encodeURIComponent(job.id)}`);
        show();
        if (job.state !== 'running') stop();
      });
    } catch (err) {
      put(progress, errorBox(err));
    }
  });
  put(box, h('h2', {}, 'Replay a time range'),
    h('p', { class: 'muted' }, 'Delivers again the items a subscription made in a time range, completed ones included: a job the server runs 1000 items at a time.'),
    form, progress);
}

function breaker(s, rerender) {
  if (!s.breaker) return '–';
  const b = s.breaker;
  const out = [state(b.state)];
  if (b.consecutive_failures) out.push(' ', h('span', { class: 'muted' }, `${b.consecutive_failures} failures`));
  if (b.last_error) out.push(h('div', { class: 'muted clip', title: b.last_error }, b.last_error));
  if (b.state !== 'closed') {
    out.push(h('div', {}, h('button', {
      type: 'button', class: 'secondary',
      onclick: async () => {
        if (!(await confirmDialog(`Enable the endpoint of ${s.name}? Its waiting items are delivered again.`, 'Enable'))) return;
        await api(`/v1/subscriptions/${encodeURIComponent(s.name)}/enable`, { method: 'POST' });
        await rerender();
      },
    }, 'Enable')));
  }
  return out;
}

// ---- inbox ---------------------------------------------------------------

const STATES = ['pending', 'processing', 'completed', 'failed'];

// The inbox page lists one state of one inbox at a time: a page of items
// by id read through the (inbox, state, id) index, and the count of each
// state on its tab. The counts do not scan the inbox: the server counts
// pending, processing and failed items in the index (the queue and the
// dead letters) and keeps the count of completed ones as items complete.
async function inbox(live, params) {
  const { view } = live;
  const inboxes = (await api('/v1/inboxes')).inboxes;
  const names = inboxes.map((i) => i.inbox);
  const name = params.get('inbox') || names[0] || '';
  if (name && !names.includes(name)) names.push(name);
  const st = STATES.includes(params.get('state')) ? params.get('state') : 'pending';
  const after = params.get('after') || '';
  const form = h('form', { class: 'filters', id: 'inbox-filters' },
    h('label', {}, 'Inbox', h('select', { name: 'inbox' },
      names.map((i) => h('option', { value: i, selected: i === name }, i)))),
    h('button', { type: 'submit' }, 'Show'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    location.hash = '#/inbox' + q({ inbox: new FormData(form).get('inbox'), state: st });
  });
  const counts = inboxes.find((i) => i.inbox === name) || {};
  const tabs = h('nav', { class: 'tabs', id: 'inbox-states', 'aria-label': 'state' },
    STATES.map((s) => h('a', { href: '#/inbox' + q({ inbox: name, state: s }), class: s === st ? 'active' : '', dataset: { state: s } },
      s, ' ', h('span', { class: 'count muted' }, counts[s] === undefined ? '–' : counts[s].toLocaleString('en')))));
  const parts = [h('h1', {}, 'Inbox'), form,
    name ? h('p', {}, h('a', { href: '#/inbox-search' + q({ inbox: name }), id: 'inbox-search-link' }, 'Search this inbox by event id, type or time »')) : null, tabs];
  if (params.get('discarded')) parts.push(h('p', { class: 'ok', id: 'inbox-note' }, `Item ${params.get('discarded')} discarded.`));
  if (name) {
    const page = await api(`/v1/inboxes/${encodeURIComponent(name)}/items` + q({ state: st, after, limit: 50 }));
    parts.push(table('items-table', [h('th', { class: 'num' }, 'Id'), 'State', 'Type', 'Event', h('th', { class: 'num' }, 'Attempts'),
      'Next attempt', 'Updated', 'Last error'],
    page.items.map((it) => h('tr', { dataset: { id: it.id } },
      h('td', { class: 'num' }, h('a', { href: `#/item/${encodeURIComponent(it.inbox)}/${it.id}` }, String(it.id))),
      h('td', {}, state(it.state)), h('td', {}, it.type), h('td', { class: 'clip', title: it.event_id }, it.event_id),
      num(it.attempts), h('td', {}, it.state === 'pending' ? time(it.next_attempt_at) : '–'), h('td', {}, time(it.updated_at)),
      h('td', { class: 'clip', title: currentError(it) }, currentError(it)))), `No ${st} items.`));
    parts.push(h('p', { class: 'muted', id: 'items-shown' }, page.items.length === 50 || after
      ? `${page.items.length} ${st} items on this page, by id.` : `${page.items.length} ${st} item${page.items.length === 1 ? '' : 's'}.`));
    parts.push(pager('#/inbox', { inbox: name, state: st }, after, page.next_after));
  } else {
    parts.push(h('p', { class: 'muted' }, 'No inboxes yet: create a subscription.'));
  }
  put(view, ...parts);
}

function pager(route, params, after, next) {
  return h('div', { class: 'actions' },
    after ? h('a', { href: route + q(params) }, '« first page') : null,
    next ? h('a', { href: route + q({ ...params, after: next }), id: 'next-page' }, 'next page »') : null);
}

// ---- one item ------------------------------------------------------------

async function item(live, _, [inboxName, id]) {
  const { view } = live;
  const path = `/v1/inboxes/${encodeURIComponent(inboxName)}/items/${encodeURIComponent(id)}`;
  const render = async (note, err) => {
    const [it, att, rep] = await Promise.all([api(path), api(path + '/attempts'), api(path + '/replies')]);
    const field = (k, v) => [h('dt', {}, k), h('dd', {}, v)];
    const replay = it.state === 'failed' ? h('button', {
      type: 'button', id: 'replay-item', class: 'danger',
      onclick: async (e) => {
        e.target.disabled = true;
        await api(`/v1/dead-letters/${it.id}/replay`, { method: 'POST' });
        await render('Replayed: the item is pending again.');
        watchItem(live, render);
      },
    }, 'Replay') : null;
    put(view,
      h('h1', {}, `Item ${it.id} `, state(it.state)),
      h('p', {}, h('a', { href: '#/inbox' + q({ inbox: it.inbox }) }, '« inbox ' + it.inbox)),
      note ? h('p', { class: 'ok', id: 'item-note' }, note) : null,
      err ? errorBox(err) : null,
      h('div', { class: 'actions' }, replay, itemActions(it, render)),
      h('div', { class: 'card' }, h('dl', { id: 'item-fields' },
        field('State', it.state), field('Attempts', String(it.attempts)), field('Type', it.type),
        field('Event id', it.event_id),
        field('Stream event', h('a', { href: eventHref(it.stream, it.offset), id: 'item-event' }, `${it.stream_event_id} (offset ${it.offset})`)),
        field('Subscription', it.subscription), field('Created', time(it.created_at)), field('Updated', time(it.updated_at)),
        field('Next attempt', time(it.next_attempt_at)), field('Failed at', time(it.failed_at)),
        field('Replays', String(it.replays)),
        it.last_error_past ? field('Earlier error', it.last_error) : field('Last error', it.last_error || '–'))),
      h('h2', {}, 'Payload'), h('pre', { id: 'item-payload' }, JSON.stringify(it.payload, null, 2)),
      h('h2', {}, 'Metadata'), h('pre', {}, JSON.stringify(it.metadata, null, 2)),
      h('h2', {}, 'Delivery handle'), h('pre', { id: 'item-handle' }, it.delivery_handle ? JSON.stringify(it.delivery_handle, null, 2) : 'none'),
      h('h2', {}, 'Replies'),
      replyTable(it, rep.replies, render),
      h('h2', {}, 'Attempts'),
      table('attempts-table', [h('th', { class: 'num' }, '#'), 'At', 'Endpoint', h('th', { class: 'num' }, 'Status'),
        h('th', { class: 'num' }, 'Latency ms'), 'Error'],
      att.attempts.map((a) => h('tr', {}, num(a.attempt), h('td', {}, time(a.attempted_at)),
        h('td', { class: 'clip' }, a.endpoint_url), num(a.status_code), num(a.latency_ms),
        h('td', { class: 'clip', title: a.error || '' }, a.error || ''))), 'No attempts recorded (items runtimes lease have none).'),
    );
    return it;
  };
  await render();
}

// watchItem re-renders an item each second until it is settled.
function watchItem(live, render) {
  const stop = live.every(1000, async () => {
    const it = await render('Replayed; waiting for delivery…');
    if (it.state === 'completed' || it.state === 'failed') {
      stop();
      await render(it.state === 'completed' ? 'Replayed and delivered.' : 'Replayed, and failed again.');
    }
  });
}

// ---- dead letters --------------------------------------------------------

function toRFC3339(local) { return local ? new Date(local).toISOString() : ''; }
function toLocal(rfc) {
  if (!rfc) return '';
  const d = new Date(rfc);
  const pad = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

async function deadLetters(live, params) {
  const { view } = live;
  const filter = { inbox: params.get('inbox') || '', subscription: params.get('subscription') || '',
    from: params.get('from') || '', to: params.get('to') || '' };
  const after = params.get('after') || '';
  const page = await api('/v1/dead-letters' + q({ ...filter, after, limit: 50 }));
  const form = h('form', { class: 'filters', id: 'dl-filters' },
    h('label', {}, 'Inbox', h('input', { name: 'inbox', value: filter.inbox, placeholder: 'any' })),
    h('label', {}, 'Subscription', h('input', { name: 'subscription', value: filter.subscription, placeholder: 'any' })),
    h('label', {}, 'Failed from', h('input', { type: 'datetime-local', name: 'from', value: toLocal(filter.from) })),
    h('label', {}, 'until', h('input', { type: 'datetime-local', name: 'to', value: toLocal(filter.to) })),
    h('button', { type: 'submit' }, 'Filter'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const f = new FormData(form);
    location.hash = '#/dead-letters' + q({ inbox: f.get('inbox').trim(), subscription: f.get('subscription').trim(),
      from: toRFC3339(f.get('from')), to: toRFC3339(f.get('to')) });
  });
  const inboxOf = new Map(page.items.map((it) => [it.id, it.inbox]));
  const progress = h('div', { id: 'replay-progress', class: 'card', hidden: true });
  const selected = () => [...view.querySelectorAll('input.pick:checked')].map((c) => Number(c.value));
  const selBtn = h('button', { type: 'button', id: 'replay-selected', disabled: true }, 'Replay selected');
  const onPick = () => {
    const n = selected().length;
    selBtn.disabled = n === 0;
    selBtn.textContent = n ? `Replay selected (${n})` : 'Replay selected';
  };
  selBtn.addEventListener('click', async () => {
    const ids = selected();
    if (!(await confirmDialog(`Replay ${ids.length} dead letter${ids.length === 1 ? '' : 's'}? Each goes back to pending with a fresh attempt budget.`))) return;
    await replayIDs(live, progress, ids, inboxOf);
  });
  const allBtn = h('button', {
    type: 'button', id: 'replay-all', class: 'danger', disabled: !page.items.length,
    onclick: async () => {
      const which = Object.entries(filter).filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(', ');
      const text = which ? `Replay every dead letter with ${which}?` : 'Replay EVERY dead letter of every inbox?';
      if (!(await confirmDialog(text + ' They go back to pending with a fresh attempt budget.', 'Replay all'))) return;
      progress.hidden = false;
      progress.replaceChildren(h('p', {}, 'Replaying…'), h('progress', {}));
      try {
        // The inboxes of the first 1000 it replays, to follow them after.
        const first = await api('/v1/dead-letters' + q({ ...filter, limit: 1000 }));
        for (const it of first.items) inboxOf.set(it.id, it.inbox);
        const res = await api('/v1/dead-letters/replay', { method: 'POST', body: which ? filter : { all: true } });
        for (const id of res.ids) if (!inboxOf.has(id) && filter.inbox) inboxOf.set(id, filter.inbox);
        await watch(live, progress, res.ids.filter((id) => inboxOf.has(id)), inboxOf, res.replayed);
      } catch (err) {
        progress.replaceChildren(errorBox(err));
      }
    },
  }, 'Replay all matching…');
  const pickAll = h('input', { type: 'checkbox', 'aria-label': 'select all on this page',
    onchange: (e) => { view.querySelectorAll('input.pick').forEach((c) => { c.checked = e.target.checked; }); onPick(); } });
  const discarded = h('div', { id: 'discard-progress', class: 'card', hidden: true });
  put(view,
    h('h1', {}, 'Dead letters'), form,
    h('div', { class: 'actions' }, selBtn, allBtn, discardButtons(live, discarded, filter, selected)), progress, discarded,
    table('dead-letters-table', [h('th', {}, pickAll), h('th', { class: 'num' }, 'Id'), 'Inbox', 'Subscription', 'Type', 'Failed at',
      h('th', { class: 'num' }, 'Attempts'), h('th', { class: 'num' }, 'Replays'), 'Last error', ''],
    page.items.map((it) => h('tr', { dataset: { id: it.id } },
      h('td', {}, h('input', { type: 'checkbox', class: 'pick', value: it.id, 'aria-label': 'select ' + it.id, onchange: onPick })),
      h('td', { class: 'num' }, h('a', { href: `#/item/${encodeURIComponent(it.inbox)}/${it.id}` }, String(it.id))),
      h('td', {}, it.inbox), h('td', {}, it.subscription), h('td', {}, it.type), h('td', {}, time(it.failed_at)),
      num(it.attempts), num(it.replays), h('td', { class: 'clip', title: it.last_error || '' }, it.last_error || ''),
      h('td', {}, h('button', { type: 'button', class: 'secondary replay-one',
        onclick: () => replayIDs(live, progress, [it.id], inboxOf) }, 'Replay')))), 'No dead letters.'),
    pager('#/dead-letters', filter, after, page.next_after),
  );
}

// replayIDs replays the dead letters ids one by one, showing how far it
// got, then watches them being delivered.
async function replayIDs(live, box, ids, inboxOf) {
  box.hidden = false;
  const bar = h('progress', { max: ids.length, value: 0 });
  const text = h('p', {}, `Replaying 0 of ${ids.length}…`);
  box.replaceChildren(text, bar);
  const errors = [];
  let done = 0;
  for (const id of ids) {
    try {
      await api(`/v1/dead-letters/${id}/replay`, { method: 'POST' });
    } catch (err) {
      errors.push(`item ${id}: ${err.message}`);
    }
    done++;
    bar.value = done;
    text.textContent = `Replaying ${done} of ${ids.length}…`;
  }
  const ok = ids.filter((id) => !errors.some((e) => e.startsWith(`item ${id}:`)));
  await watch(live, box, ok, inboxOf, ok.length, errors);
}

// watch polls the replayed items until each is completed or failed again.
async function watch(live, box, ids, inboxOf, replayed, errors = []) {
  const bar = h('progress', { max: Math.max(ids.length, 1), value: 0 });
  const text = h('p', { id: 'replay-status' });
  const errs = errors.length ? h('p', { class: 'error' }, errors.join('\n')) : null;
  box.replaceChildren(text, bar, errs || '');
  const states = new Map(ids.map((id) => [id, 'pending']));
  const show = () => {
    const c = [...states.values()];
    const completed = c.filter((s) => s === 'completed').length;
    const failed = c.filter((s) => s === 'failed').length;
    bar.value = completed + failed;
    text.textContent = `Replayed ${replayed}. ${ids.length < replayed ? `Following ${ids.length}: d` : 'D'}elivered ${completed} of ${ids.length}` +
      (failed ? `, ${failed} failed again` : '') + (completed + failed < ids.length ? '; waiting…' : '.');
    text.dataset.done = String(completed + failed === ids.length);
    text.dataset.completed = String(completed);
  };
  show();
  if (!ids.length) return;
  const stop = live.every(1000, async () => {
    const open = ids.filter((id) => !['completed', 'failed'].includes(states.get(id))).slice(0, 100);
    await Promise.all(open.map(async (id) => {
      try {
        const it = await api(`/v1/inboxes/${encodeURIComponent(inboxOf.get(id))}/items/${id}`);
        states.set(id, it.state);
      } catch { /* gone: retention */ }
    }));
    show();
    if (text.dataset.done === 'true') stop();
  });
}

// ---- webhooks ------------------------------------------------------------

async function webhooks(live, params) {
  const { view } = live;
  const id = params.get('id') || '';
  const key = params.get('key') || '';
  const source = params.get('source') || '';
  const form = h('form', { class: 'filters', id: 'webhook-form' },
    h('label', {}, 'Webhook id', h('input', { name: 'id', value: id, placeholder: 'wh_42' })),
    h('span', { class: 'muted' }, 'or'),
    h('label', {}, 'Idempotency key', h('input', { name: 'key', value: key })),
    h('label', {}, 'of source', h('input', { name: 'source', value: source, placeholder: 'webhooks' })),
    h('button', { type: 'submit' }, 'Look up'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const f = new FormData(form);
    location.hash = '#/webhooks' + q({ id: f.get('id').trim(), key: f.get('key').trim(), source: f.get('source').trim() });
  });
  const parts = [h('h1', {}, 'Webhooks'), form];
  if (id || key) {
    try {
      // An id names its source (wh_gh_1); a key is looked up in the
      // source given, else the default one.
      const w = id ? await api('/webhooks/' + encodeURIComponent(id)) : await api('/webhooks' + q({ idempotency_key: key, source }));
      const field = (k, v) => [h('dt', {}, k), h('dd', {}, v)];
      parts.push(h('div', { class: 'card' }, h('dl', { id: 'webhook-result' },
        field('Id', w.id), field('Idempotency key', w.idempotency_key), field('Type', w.type),
        field('Status', state(w.status)), field('Attempts', String(w.attempts ?? 0)),
        field('Last error', w.last_error || '–'), field('Created', time(w.created_at)), field('Updated', time(w.updated_at)),
        w.subscription ? field('Status of', w.subscription) : null,
        w.stream ? field('Event', h('a', { href: eventHref(w.stream, w.offset), id: 'webhook-event' }, `${w.stream}/${w.offset}: its deliveries and attempts »`)) : null)),
      w.note ? h('p', { class: 'muted', id: 'webhook-note' }, w.note) : null,
      w.deliveries ? [h('h2', {}, 'Deliveries'), deliveriesTable(w.deliveries)] : null);
    } catch (err) {
      if (!(err instanceof APIError) || err.status !== 404) throw err;
      parts.push(h('p', { class: 'error', id: 'webhook-result' }, err.message));
    }
  }
  put(view, ...parts);
}

// ---- routing -------------------------------------------------------------

const pages = {
  '': overview, streams, subscriptions, inbox, item, 'dead-letters': deadLetters, webhooks,
  subscription, 'new-subscription': newSubscription,
};
Object.assign(pages, eventPages); // events.js: an event and its deliveries, the searches

// Live holds the timers of the page on screen; a new page stops them.
class Live {
  constructor() { this.timers = new Set(); this.stopped = false; }

  // every runs fn every ms until the page changes or the returned stop is
  // called; a run that fails shows nothing new and tries again.
  every(ms, fn) {
    let timer = null;
    const tick = async () => {
      if (this.stopped || !this.timers.has(timer)) return;
      try { await fn(); } catch { /* the next tick tries again */ }
      if (!this.stopped && this.timers.has(timer)) timer = reset(timer);
    };
    const reset = (old) => {
      this.timers.delete(old);
      const t = setTimeout(tick, ms);
      this.timers.add(t);
      return t;
    };
    timer = reset(null);
    return () => { clearTimeout(timer); this.timers.delete(timer); };
  }

  stop() { this.stopped = true; for (const t of this.timers) clearTimeout(t); this.timers.clear(); }
}

let live = new Live();

async function route() {
  live.stop();
  live = new Live();
  const mine = live;
  delete document.body.dataset.page; // set again once the page is drawn
  mine.view = h('div', { class: 'page' }, h('p', { class: 'muted' }, 'Loading…'));
  root.replaceChildren(mine.view);
  const hash = location.hash.replace(/^#\/?/, '');
  const [path, query] = hash.split('?');
  const [page, ...args] = path.split('/').map(decodeURIComponent);
  const fn = pages[page];
  for (const a of document.querySelectorAll('#nav a')) {
    a.classList.toggle('active', a.dataset.page === (page || 'overview') || (page === 'item' && a.dataset.page === 'inbox') ||
      (page === 'inbox-search' && a.dataset.page === 'inbox') || ((page === 'stream' || page === 'event') && a.dataset.page === 'streams') ||
      ((page === 'subscription' || page === 'new-subscription') && a.dataset.page === 'subscriptions'));
  }
  document.getElementById('signout').hidden = !token();
  if (!fn) {
    put(mine.view, h('p', { class: 'error' }, `No page ${page}.`));
    return;
  }
  try {
    await fn(mine, new URLSearchParams(query || ''), args);
    if (mine === live) {
      document.body.dataset.page = page || 'overview';
      window.postboxDrawnAt = performance.now(); // how long the page took, for the load-time measurement
    }
  } catch (err) {
    put(mine.view, h('h1', {}, 'Something went wrong'), errorBox(err));
  }
}

window.addEventListener('hashchange', route);
document.addEventListener('postbox-token', () => { document.getElementById('signout').hidden = false; });
document.getElementById('signout').addEventListener('click', () => { forget(); location.reload(); });
route();
