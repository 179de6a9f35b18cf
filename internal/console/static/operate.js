// The console's acts: create, edit and delete subscriptions and their
// endpoints, rotate a secret, pause and resume delivery, send a test
// event, cancel and discard items and dead letters, and the overview of
// what is stuck. Each act is one call of the operator API, which checks
// it as it checks the CLI's; its refusal is shown on the page as it came.

import { api, q } from './api.js';
import { h, put, time, state, table, num, errorBox, confirmDialog } from './app.js';

const enc = encodeURIComponent;

// ---- what is stuck (the overview) ---------------------------------------

// age says how long ago an RFC 3339 time was: "42 s", "3 min", "5 h", "2 d".
export function age(rfc, now = Date.now()) {
  if (!rfc) return '–';
  const s = Math.max(0, (now - new Date(rfc)) / 1000);
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 90 * 60) return `${Math.round(s / 60)} min`;
  if (s < 36 * 3600) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

// A subscription whose oldest pending item waits longer than this is stuck.
const STALE_MS = 5 * 60 * 1000;

// countsOf returns the item counts of subscription s: its own (counts)
// when the server keeps them, else those of its inbox, whose oldest
// pending time stands in for its own when it has none.
function countsOf(s, inboxes) {
  return { ...(inboxes.get(s.inbox) || {}), ...(s.counts || {}) };
}

// stuck draws what needs an operator: the writer and the store, and every
// subscription that is paused, whose breaker is open or disabled, that
// has dead letters or whose oldest pending item is old, with links.
export async function stuck() {
  const [subs, inb, ready] = await Promise.all([
    api('/v1/subscriptions'),
    api('/v1/inboxes'),
    fetch('/ready', { cache: 'no-store' }).then(async (r) => ({ ok: r.ok, ...(await r.json().catch(() => ({}))) })).catch((e) => ({ ok: false, reason: String(e) })),
  ]);
  const inboxes = new Map(inb.inboxes.map((i) => [i.inbox, i]));
  const now = Date.now();
  const rows = [];
  for (const s of subs.subscriptions) {
    const c = countsOf(s, inboxes);
    const b = s.breaker && s.breaker.state !== 'closed' ? s.breaker : null;
    const old = c.pending > 0 && c.oldest_pending_at && now - new Date(c.oldest_pending_at) > STALE_MS;
    if (!s.paused && !b && !c.failed && !old) continue;
    const why = [];
    if (s.paused) why.push(h('span', { class: 'state state-open' }, 'paused'), s.paused_reason ? ` ${s.paused_reason}` : '', ' ');
    if (b) why.push(h('span', { class: 'state state-' + b.state }, 'breaker ' + b.state), ' ');
    rows.push(h('tr', { dataset: { name: s.name } },
      h('td', {}, h('a', { href: '#/subscription/' + enc(s.name) }, s.name)),
      h('td', { class: 'why' }, why.length ? why : '–'),
      h('td', { class: 'num dead' }, c.failed ? h('a', { href: '#/dead-letters' + q({ subscription: s.name }) }, String(c.failed)) : '0'),
      h('td', { class: 'num' }, h('a', { href: '#/inbox' + q({ inbox: s.inbox, state: 'pending' }) }, String(c.pending ?? '–'))),
      h('td', { class: 'num oldest' + (old ? ' error' : '') }, age(c.oldest_pending_at, now)),
      h('td', { class: 'clip', title: (b && b.last_error) || '' }, (b && b.last_error) || '')));
  }
  const healthy = ready.ok && ready.status === 'ready';
  const health = h('div', { class: 'card', id: 'health', dataset: { ok: String(healthy) } },
    h('b', {}, 'Writer and store: '), healthy ? h('span', { class: 'ok' }, 'ready') : h('span', { class: 'error' }, ready.status || 'unreachable'),
    ready.queue_capacity ? ` — writer queue ${ready.queue_depth} of ${ready.queue_capacity}` : '',
    ready.node ? h('span', { class: 'muted' }, ` (node ${ready.node})`) : '',
    ready.reason ? h('div', { class: 'error' }, ready.reason + (ready.since ? ` (since ${time(ready.since)})` : '')) : '');
  return [
    h('h2', {}, 'What is stuck'),
    health,
    table('stuck-table', ['Subscription', 'Delivery', h('th', { class: 'num' }, 'Dead letters'), h('th', { class: 'num' }, 'Pending'),
      h('th', { class: 'num' }, 'Oldest pending'), 'Endpoint error'], rows,
    'Nothing is stuck: no subscription is paused, no breaker is open, there are no dead letters and nothing has waited over 5 minutes.'),
  ];
}

// ---- subscriptions: pause and resume from the list ------------------------

// delivery is the cell of a subscription's delivery in the list: its
// state and the button that pauses or resumes it.
export function delivery(s, rerender) {
  const btn = s.paused
    ? h('button', { type: 'button', class: 'secondary resume', onclick: () => act(`/v1/subscriptions/${enc(s.name)}/resume`) }, 'Resume')
    : h('button', { type: 'button', class: 'secondary pause', onclick: async () => {
      if (!(await confirmDialog(`Pause the delivery of ${s.name}? Its inbox keeps filling; nothing is delivered or leased until it is resumed.`, 'Pause'))) return;
      await act(`/v1/subscriptions/${enc(s.name)}/pause`);
    } }, 'Pause');
  const out = h('div', {});
  async function act(path) {
    btn.disabled = true;
    try {
      await api(path, { method: 'POST' });
      await rerender();
    } catch (err) {
      btn.disabled = false;
      out.append(errorBox(err));
    }
  }
  put(out, s.paused ? h('span', { class: 'state state-open', title: s.paused_reason || '' }, 'paused') : h('span', { class: 'state state-closed' }, 'delivering'),
    s.paused ? h('div', { class: 'muted' }, 'since ' + time(s.paused_at)) : null, h('div', {}, btn));
  return out;
}

// ---- a subscription's form --------------------------------------------------

// The endpoint settings a form edits: [JSON name, label, input type, an
// example]. An empty one is the server's setting.
const SETTINGS = [
  ['timeout', 'Timeout', 'text', '10s'],
  ['retry_schedule', 'Retry schedule', 'text', '5s,5m,30m'],
  ['retry_base_delay', 'Retry base delay', 'text', '1s'],
  ['retry_max_delay', 'Retry max delay', 'text', '1h'],
  ['max_attempts', 'Max attempts', 'number', '10'],
  ['rate', 'Rate', 'text', '50/s'],
  ['concurrency', 'Concurrency', 'number', '4'],
  ['breaker_failures', 'Breaker failures (0: none)', 'number', '10'],
  ['breaker_probe', 'Breaker probe', 'text', '30s'],
  ['disable_after', 'Disable after', 'text', '24h'],
];

// headersText writes headers one "Name: value" a line.
function headersText(hs) {
  return Object.entries(hs || {}).map(([k, v]) => `${k}: ${v}`).join('\n');
}

// parseHeaders reads "Name: value" lines; a line without a colon is sent
// as a name with an empty value, for the server to refuse by name.
function parseHeaders(text) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    const i = line.indexOf(':');
    if (i < 0) out[line.trim()] = '';
    else out[line.slice(0, i).trim()] = line.slice(i + 1).trim();
  }
  return out;
}

// number reads a number field: a number, or the text as typed for the
// server to refuse.
function number(v) {
  const n = Number(v);
  return v.trim() !== '' && Number.isFinite(n) ? n : v;
}

// endpointFields are the inputs of the target and its settings, filled
// from s (a subscription, or {} for a new one).
function endpointFields(s) {
  return [
    h('label', { class: 'wide' }, 'Target URL (empty: runtimes lease the inbox)',
      h('input', { name: 'target', type: 'url', value: s.target || '', placeholder: 'https://example.com/hooks' })),
    h('label', { class: 'wide' }, 'Headers sent with each delivery, one "Name: value" a line',
      h('textarea', { name: 'headers', rows: 3, dataset: { initial: headersText(s.headers) } }, headersText(s.headers))),
    h('label', {}, 'Format', h('select', { name: 'format' },
      ['postbox', 'cloudevents'].map((f) => h('option', { value: f, selected: (s.format || 'postbox') === f }, f)))),
    ...SETTINGS.map(([k, label, type, hint]) => h('label', {}, label,
      h('input', { name: k, type: type === 'number' ? 'text' : type, inputmode: type === 'number' ? 'numeric' : null,
        value: s[k] === null || s[k] === undefined ? '' : String(s[k]), placeholder: `server's (e.g. ${hint})` }))),
  ];
}

// newSubscription is the page that creates a subscription.
export async function newSubscription(live) {
  const { view } = live;
  const sources = (await api('/v1/sources')).sources;
  const errBox = h('div', { id: 'form-error' });
  const form = h('form', { id: 'subscription-form', class: 'card form-grid' },
    h('label', {}, 'Name', h('input', { name: 'name', required: true, placeholder: 'billing' })),
    h('label', {}, 'Source', h('select', { name: 'source' }, sources.map((s) => h('option', { value: s.name, selected: s.name === 'webhooks' }, s.name)))),
    h('label', {}, 'Types (comma-separated patterns; empty: every type)', h('input', { name: 'types', placeholder: 'invoice.*, customer.created' })),
    h('label', {}, 'Inbox (empty: the name)', h('input', { name: 'inbox' })),
    h('label', {}, 'Start', h('select', { name: 'start' }, h('option', { value: 'latest' }, 'latest'), h('option', { value: 'earliest' }, 'earliest'))),
    h('label', {}, 'Signing secret (whsec_…; empty: unsigned)', h('input', { name: 'secret', autocomplete: 'off' })),
    endpointFields({}),
    h('div', { class: 'actions wide' }, h('button', { type: 'submit' }, 'Create subscription'), h('a', { href: '#/subscriptions' }, 'Cancel')),
    h('div', { class: 'wide' }, errBox));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const f = new FormData(form);
    const body = { name: f.get('name').trim(), source: f.get('source'), start: f.get('start') };
    const types = f.get('types').split(',').map((t) => t.trim()).filter(Boolean);
    if (types.length) body.types = types;
    for (const k of ['inbox', 'target', 'secret']) if (f.get(k).trim()) body[k] = f.get(k).trim();
    if (f.get('headers').trim()) body.headers = parseHeaders(f.get('headers'));
    if (f.get('format') !== 'postbox') body.format = f.get('format');
    for (const [k, , type] of SETTINGS) {
      const v = f.get(k).trim();
      if (v) body[k] = type === 'number' ? number(v) : v;
    }
    put(errBox);
    try {
      const s = await api('/v1/subscriptions', { method: 'POST', body });
      location.hash = '#/subscription/' + enc(s.name) + q({ note: 'created' });
    } catch (err) {
      put(errBox, errorBox(err));
    }
  });
  put(view, h('h1', {}, 'New subscription'), form);
}

// ---- one subscription -------------------------------------------------------

const NOTES = { created: 'Created.', saved: 'Saved.', rotated: 'Secret rotated.', paused: 'Paused.', resumed: 'Resumed.' };

// subscription is the page of one subscription: its definition, delivery
// (pause, resume, test event), endpoint settings and secrets, and delete.
export async function subscription(live, params, [name]) {
  const { view } = live;
  const path = '/v1/subscriptions/' + enc(name);
  const s = await api(path);
  const field = (k, v) => [h('dt', {}, k), h('dd', {}, v)];
  const note = NOTES[params.get('note')];
  const reload = (n) => {
    const want = '#/subscription/' + enc(name) + q({ note: n });
    if (location.hash === want) window.dispatchEvent(new HashChangeEvent('hashchange'));
    else location.hash = want;
  };

  // Delivery: pause or resume, and a test event.
  const delErr = h('div', { id: 'delivery-error' });
  const reason = h('input', { id: 'pause-reason', name: 'reason', placeholder: 'why (optional)' });
  const pauseBtn = s.paused
    ? h('button', { type: 'button', id: 'resume-btn', onclick: async () => {
      try { await api(path + '/resume', { method: 'POST' }); reload('resumed'); } catch (err) { put(delErr, errorBox(err)); }
    } }, 'Resume delivery')
    : h('button', { type: 'button', id: 'pause-btn', class: 'danger', onclick: async () => {
      const body = reason.value.trim() ? { reason: reason.value.trim() } : undefined;
      try { await api(path + '/pause', { method: 'POST', body }); reload('paused'); } catch (err) { put(delErr, errorBox(err)); }
    } }, 'Pause delivery');
  const testOut = h('div', { id: 'test-out' });
  const testBtn = h('button', { type: 'button', id: 'test-btn', class: 'secondary', disabled: !s.target, title: s.target ? '' : 'no target: runtimes lease this inbox',
    onclick: async () => {
      testBtn.disabled = true;
      put(testOut, h('p', { class: 'muted' }, 'Sending a postbox.test event…'));
      try {
        const r = await api(path + '/test', { method: 'POST' });
        put(testOut, h('div', { class: 'card', id: 'test-result', dataset: { ok: String(r.ok) } }, h('dl', {},
          field('Result', r.ok ? h('span', { class: 'ok' }, 'delivered') : h('span', { class: 'error' }, 'not delivered')),
          field('Status', r.status_code ? String(r.status_code) : 'no answer'), field('Latency', `${r.latency_ms} ms`),
          field('Event', r.event_id), field('Endpoint', r.endpoint_url),
          r.error ? field('Error', r.error) : null, r.response_excerpt ? field('Answer', r.response_excerpt) : null)));
      } catch (err) {
        put(testOut, errorBox(err));
      }
      testBtn.disabled = false;
    } }, 'Send test event');

  // Endpoint settings: only what changed is sent; a cleared setting goes
  // back to the server's default (null).
  const epErr = h('div', { id: 'endpoint-error' });
  const epForm = h('form', { id: 'endpoint-form', class: 'card form-grid' }, endpointFields(s),
    h('div', { class: 'actions wide' }, h('button', { type: 'submit' }, 'Save endpoint')), h('div', { class: 'wide' }, epErr));
  epForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    const f = new FormData(epForm);
    const body = {};
    const target = f.get('target').trim();
    if (target !== (s.target || '')) body.target = target || null;
    const hs = epForm.querySelector('[name=headers]');
    if (hs.value !== hs.dataset.initial) body.headers = hs.value.trim() ? parseHeaders(hs.value) : null;
    if (f.get('format') !== (s.format || 'postbox')) body.format = f.get('format');
    for (const [k, , type] of SETTINGS) {
      const v = f.get(k).trim();
      const was = s[k] === null || s[k] === undefined ? '' : String(s[k]);
      if (v === was) continue;
      body[k] = v === '' ? null : (type === 'number' ? number(v) : v);
    }
    put(epErr);
    if (!Object.keys(body).length) { put(epErr, h('p', { class: 'muted' }, 'Nothing changed.')); return; }
    try {
      await api(path, { method: 'PATCH', body });
      reload('saved');
    } catch (err) {
      put(epErr, errorBox(err));
    }
  });

  // Secrets: rotate (the old one keeps signing for the overlap) or stop signing.
  const secErr = h('div', { id: 'secret-error' });
  const secInput = h('input', { name: 'secret', id: 'new-secret', autocomplete: 'off', placeholder: 'whsec_…' });
  const secForm = h('form', { id: 'secret-form', class: 'filters' },
    h('label', {}, 'New secret', secInput),
    h('button', { type: 'button', class: 'secondary', id: 'generate-secret', onclick: () => { secInput.value = newSecret(); } }, 'Generate'),
    h('label', {}, 'Old one valid for', h('input', { name: 'overlap', placeholder: 'default 24h' })),
    h('button', { type: 'submit' }, 'Rotate secret'),
    s.secrets && s.secrets.length ? h('button', { type: 'button', class: 'secondary', id: 'unsign', onclick: async () => {
      if (!(await confirmDialog(`Stop signing the deliveries of ${name}? Every secret is removed.`, 'Stop signing'))) return;
      try { await api(path, { method: 'PATCH', body: { secret: null } }); reload('saved'); } catch (err) { put(secErr, errorBox(err)); }
    } }, 'Stop signing') : null);
  secForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    const f = new FormData(secForm);
    const body = { secret: f.get('secret').trim() };
    if (f.get('overlap').trim()) body.secret_overlap = f.get('overlap').trim();
    put(secErr);
    try {
      await api(path, { method: 'PATCH', body });
      reload('rotated');
    } catch (err) {
      put(secErr, errorBox(err));
    }
  });

  const delBtn = h('button', { type: 'button', id: 'delete-btn', class: 'danger', onclick: async () => {
    if (!(await confirmDialog(`Delete subscription ${name}? Its consumer goes; the items of inbox ${s.inbox} stay.`, 'Delete'))) return;
    try {
      await api(path, { method: 'DELETE' });
      location.hash = '#/subscriptions';
    } catch (err) {
      put(delErr, errorBox(err));
    }
  } }, 'Delete subscription…');

  const b = s.breaker;
  put(view,
    h('h1', {}, `Subscription ${s.name} `, s.paused ? h('span', { class: 'state state-open', id: 'paused-state' }, 'paused') : h('span', { class: 'state state-closed' }, 'delivering')),
    h('p', {}, h('a', { href: '#/subscriptions' }, '« subscriptions')),
    note ? h('p', { class: 'ok', id: 'sub-note' }, note) : null,
    h('div', { class: 'card', id: 'subscription-detail' }, h('dl', {},
      field('Source', s.source), field('Inbox', h('a', { href: '#/inbox' + q({ inbox: s.inbox }) }, s.inbox)),
      field('Types', s.types && s.types.length ? s.types.join(', ') : 'all'),
      field('Start', s.start), field('Created', time(s.created_at)),
      field('Lag', `${s.lag} events`),
      field('Delivery', s.paused ? `paused since ${time(s.paused_at)}${s.paused_reason ? ': ' + s.paused_reason : ''}` : 'delivering'),
      field('Breaker', b ? [state(b.state), b.last_error ? ' ' + b.last_error : ''] : '–'),
      s.order_by ? field('Ordered by', `${s.order_by} (dead letters: ${s.on_dead_letter})`) : null,
      s.held ? field('Keys held back', s.held.keys ? `${s.held.keys}, the oldest item waiting since ${time(s.held.oldest_at)}` : 'none') : null,
      field('Dead letters', h('a', { href: '#/dead-letters' + q({ subscription: s.name }) }, 'list')))),
    h('h2', {}, 'Delivery'),
    h('div', { class: 'actions' }, s.paused ? null : reason, pauseBtn, testBtn),
    delErr, testOut,
    h('h2', {}, 'Endpoint'), epForm,
    h('h2', {}, 'Signing secrets'),
    table('secrets-table', ['Fingerprint', 'Created', 'Valid until'], (s.secrets || []).map((x) => h('tr', {},
      h('td', {}, x.fingerprint), h('td', {}, time(x.created_at)), h('td', {}, x.expires_at ? time(x.expires_at) : 'current'))),
    'Deliveries are not signed.'),
    secForm, secErr,
    h('h2', {}, 'Delete'), h('div', { class: 'actions' }, delBtn),
  );
}

// newSecret makes a Standard Webhooks secret: whsec_ and 24 random bytes
// in base64.
function newSecret() {
  const b = crypto.getRandomValues(new Uint8Array(24));
  return 'whsec_' + btoa(String.fromCharCode(...b));
}

// ---- one item: cancel and discard ------------------------------------------

// itemActions are the buttons of an item's page: cancel a pending one,
// discard one that is not processing. done(note) draws the page again.
export function itemActions(it, done) {
  const base = `/v1/inboxes/${enc(it.inbox)}/items/${it.id}`;
  const out = [];
  if (it.state === 'pending') {
    out.push(h('button', { type: 'button', id: 'cancel-item', class: 'secondary', onclick: async () => {
      if (!(await confirmDialog(`Cancel item ${it.id}? It becomes a dead letter and is not delivered unless it is replayed.`, 'Cancel item'))) return;
      try { await api(base + '/cancel', { method: 'POST' }); await done('Cancelled: the item is a dead letter.'); } catch (err) { await done(null, err); }
    } }, 'Cancel'));
  }
  if (it.state !== 'processing') {
    out.push(h('button', { type: 'button', id: 'discard-item', class: 'danger', onclick: async () => {
      if (!(await confirmDialog(`Discard item ${it.id} for good, with its attempts? This cannot be undone.`, 'Discard'))) return;
      try {
        await api(base + '/discard', { method: 'POST' });
        location.hash = '#/inbox' + q({ inbox: it.inbox, state: it.state, discarded: it.id });
      } catch (err) { await done(null, err); }
    } }, 'Discard…'));
  }
  return out;
}

// replyTable lists the replies to an item's event, a failed one with a
// button that sends it again. done(note) draws the page again.
export function replyTable(it, replies, done) {
  const base = `/v1/inboxes/${enc(it.inbox)}/items/${it.id}/replies/`;
  return table('replies-table', ['Key', 'State', h('th', { class: 'num' }, 'Attempts'), 'To', 'Last error', ''],
    replies.map((r) => h('tr', {}, h('td', { class: 'clip' }, r.key), h('td', {}, state(r.state)), num(r.attempts),
      h('td', { class: 'clip' }, r.url), h('td', { class: 'clip', title: r.last_error || '' }, r.last_error || ''),
      h('td', {}, r.state === 'failed' ? h('button', { type: 'button', class: 'secondary retry-reply', onclick: async () => {
        try { await api(base + enc(r.key) + '/retry', { method: 'POST' }); await done('Sending the reply again.'); } catch (err) { await done(null, err); }
      } }, 'Send again') : null))),
    it.delivery_handle && it.delivery_handle.url ? 'No replies.' : 'No replies (the event\'s handle names no url to reply to).');
}

// ---- dead letters: discard -------------------------------------------------

// discardButtons are the buttons of the dead-letter page that discard the
// selected dead letters, or every one the filter matches.
export function discardButtons(live, box, filter, selected) {
  const show = (res) => {
    box.hidden = false;
    put(box, h('p', { id: 'discard-status', dataset: { done: 'true' } }, `Discarded ${res.discarded} dead letter${res.discarded === 1 ? '' : 's'}.`),
      h('p', {}, h('a', { href: location.hash, onclick: () => window.dispatchEvent(new HashChangeEvent('hashchange')) }, 'Show the list again')));
  };
  const sel = h('button', { type: 'button', id: 'discard-selected', class: 'secondary', onclick: async () => {
    const ids = selected();
    if (!ids.length) return;
    if (!(await confirmDialog(`Discard ${ids.length} dead letter${ids.length === 1 ? '' : 's'} for good? This cannot be undone.`, 'Discard'))) return;
    try { show(await api('/v1/dead-letters/discard', { method: 'POST', body: { ids } })); } catch (err) { box.hidden = false; put(box, errorBox(err)); }
  } }, 'Discard selected');
  const all = h('button', { type: 'button', id: 'discard-all', class: 'danger', onclick: async () => {
    const which = Object.entries(filter).filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(', ');
    const text = which ? `Discard every dead letter with ${which} for good?` : 'Discard EVERY dead letter of every inbox for good?';
    if (!(await confirmDialog(text + ' This cannot be undone.', 'Discard all'))) return;
    try { show(await api('/v1/dead-letters/discard', { method: 'POST', body: which ? filter : { all: true } })); } catch (err) { box.hidden = false; put(box, errorBox(err)); }
  } }, 'Discard all matching…');
  return [sel, all];
}

