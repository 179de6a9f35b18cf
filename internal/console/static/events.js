// The console's pages of one event and its deliveries, and the searches
// of a stream's events and an inbox's items. Each reads one bounded
// answer of the API (an event, or a page of 50), found by an index, so a
// page costs the same with millions of events stored.

import { api, q, APIError } from './api.js';
import { h, time, put, state, table, num, currentError } from './app.js';

const PAGE = 50;

function toRFC3339(local) { return local ? new Date(local).toISOString() : ''; }
function toLocal(rfc) {
  if (!rfc) return '';
  const d = new Date(rfc);
  const pad = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

// eventHref is the route of the page of the event at offset of stream.
export function eventHref(stream, offset) {
  return `#/event/${encodeURIComponent(stream)}/${encodeURIComponent(offset)}`;
}

function itemHref(it) { return `#/item/${encodeURIComponent(it.inbox)}/${it.id}`; }

// deliveriesTable shows what each subscription made of an event.
export function deliveriesTable(deliveries) {
  return table('deliveries-table', ['Subscription', 'Inbox', 'Item', 'State', h('th', { class: 'num' }, 'Attempts'),
    'Last attempt', 'Answer', 'Last error'],
  deliveries.map((d) => {
    const last = d.attempts.length ? d.attempts[d.attempts.length - 1] : null;
    const sub = [d.subscription, d.deleted ? h('span', { class: 'muted deleted' }, ' (deleted)') : null,
      d.paused ? h('span', { class: 'muted paused' }, ' (paused)') : null];
    if (!d.item) {
      return h('tr', { dataset: { subscription: d.subscription, status: d.status } },
        h('td', {}, sub), h('td', {}, d.inbox), h('td', {}, '–'), h('td', {}, state(d.status)), num(null),
        h('td', {}, '–'), h('td', {}, '–'), h('td', { class: 'muted' }, d.reason || ''));
    }
    return h('tr', { dataset: { subscription: d.subscription, status: d.status, state: d.item.state, deleted: String(d.deleted) } },
      h('td', {}, sub), h('td', {}, d.inbox),
      h('td', { class: 'num' }, h('a', { href: itemHref(d.item) }, String(d.item.id))),
      h('td', {}, state(d.item.state)), num(d.item.attempts),
      h('td', {}, last ? time(last.attempted_at) : '–'),
      h('td', {}, last ? (last.status_code ? String(last.status_code) : 'no answer') : '–'),
      h('td', { class: 'clip', title: currentError(d.item) }, currentError(d.item)));
  }), 'No subscription of this stream takes this event.');
}

// attemptLogs shows the endpoint's answer to every attempt, by
// subscription.
function attemptLogs(deliveries) {
  return deliveries.filter((d) => d.attempts.length).flatMap((d) => [
    h('h3', {}, `Attempts of ${d.subscription}`),
    table('attempts-' + d.subscription, [h('th', { class: 'num' }, '#'), 'At', 'Endpoint', h('th', { class: 'num' }, 'Status'),
      h('th', { class: 'num' }, 'Latency ms'), 'Error', 'Answer'],
    d.attempts.map((a) => h('tr', {}, num(a.attempt), h('td', {}, time(a.attempted_at)),
      h('td', { class: 'clip' }, a.endpoint_url), num(a.status_code), num(a.latency_ms),
      h('td', { class: 'clip', title: a.error || '' }, a.error || ''),
      h('td', { class: 'clip', title: a.response_excerpt || '' }, a.response_excerpt || '')))),
  ]);
}

// event is the page of one event: #/event/STREAM/OFFSET, or
// #/event/STREAM?id=ID (an event_id or idempotency key).
async function event(live, params, [stream, offset]) {
  const { view } = live;
  let ev;
  try {
    ev = offset ? await api(`/v1/streams/${encodeURIComponent(stream)}/events/${encodeURIComponent(offset)}`)
      : await api(`/v1/streams/${encodeURIComponent(stream)}/events` + q({ id: params.get('id') || '', variant: params.get('variant') || '' }));
  } catch (err) {
    if (!(err instanceof APIError) || (err.status !== 404 && err.status !== 409)) throw err;
    put(view, h('h1', {}, 'Event'), h('p', { class: 'error', id: 'event-error' }, err.message));
    return;
  }
  const field = (k, v) => [h('dt', {}, k), h('dd', {}, v)];
  put(view,
    h('h1', {}, `Event ${ev.id}`),
    h('p', {}, h('a', { href: `#/stream/${encodeURIComponent(ev.stream)}` }, '« stream ' + ev.stream)),
    h('div', { class: 'card' }, h('dl', { id: 'event-fields' },
      field('Event id', ev.event_id), ev.variant ? field('Variant', ev.variant) : null,
      ev.webhook_id ? field('Webhook', h('a', { href: '#/webhooks' + q({ id: ev.webhook_id }) }, ev.webhook_id)) : null,
      field('Type', ev.type), field('Stream', `${ev.stream} (offset ${ev.offset})`),
      field('Occurred', time(ev.occurred_at)), field('Stored', time(ev.stored_at)))),
    h('h2', {}, 'Deliveries'),
    h('p', { class: 'muted' }, 'Each subscription that takes this event: its item, where it stands, and the endpoint\'s answers.'),
    deliveriesTable(ev.deliveries),
    attemptLogs(ev.deliveries),
    h('h2', {}, 'Payload'), h('pre', { id: 'event-payload' }, JSON.stringify(ev.payload, null, 2)),
    h('h2', {}, 'Metadata'), h('pre', {}, JSON.stringify(ev.metadata, null, 2)),
  );
}

// searchForm is the form of a search page: id or key, type, since,
// until (and state for items); submitted, it goes to hrefOf(filter).
function searchForm(id, hrefOf, f, withState) {
  const form = h('form', { class: 'filters', id },
    h('label', {}, 'Event id or key', h('input', { name: 'id', value: f.id, placeholder: 'any' })),
    h('label', {}, 'Type', h('input', { name: 'type', value: f.type, placeholder: 'any' })),
    withState ? h('label', {}, 'State', h('select', { name: 'state' },
      ['', 'pending', 'processing', 'completed', 'failed'].map((s) => h('option', { value: s, selected: s === f.state }, s || 'any')))) : null,
    h('label', {}, 'Since', h('input', { type: 'datetime-local', name: 'since', value: toLocal(f.since) })),
    h('label', {}, 'Until', h('input', { type: 'datetime-local', name: 'until', value: toLocal(f.until) })),
    h('button', { type: 'submit' }, 'Search'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const d = new FormData(form);
    location.hash = hrefOf({ id: d.get('id').trim(), type: d.get('type').trim(), state: withState ? d.get('state') : '',
      since: toRFC3339(d.get('since')), until: toRFC3339(d.get('until')) });
  });
  return form;
}

function filterOf(params) {
  return { id: params.get('id') || '', type: params.get('type') || '', state: params.get('state') || '',
    since: params.get('since') || '', until: params.get('until') || '' };
}

// pager links the newest page and the next older one.
function pager(hrefOf, f, before, next) {
  return h('div', { class: 'actions' },
    before ? h('a', { href: hrefOf(f) }, '« newest') : null,
    next ? h('a', { href: hrefOf({ ...f, before: next }), id: 'next-page' }, 'older »') : null);
}

// stream is the stream browser: a stream's newest events, or those a
// search selects, each linked to its page.
async function stream(live, params, [name]) {
  const { view } = live;
  const hrefOf = (filter) => `#/stream/${encodeURIComponent(name)}` + q(filter);
  const f = filterOf(params);
  const before = params.get('before') || '';
  const page = await api(`/v1/streams/${encodeURIComponent(name)}/search` + q({ id: f.id, type: f.type, since: f.since, until: f.until, before, limit: PAGE }));
  put(view,
    h('h1', {}, `Stream ${name}`),
    h('p', {}, h('a', { href: '#/streams' }, '« sources & streams')),
    searchForm('event-search', hrefOf, f, false),
    table('events-table', [h('th', { class: 'num' }, 'Offset'), 'Stored', 'Type', 'Event id', 'Variant'],
      page.events.map((ev) => h('tr', { dataset: { offset: ev.offset } },
        h('td', { class: 'num' }, h('a', { href: eventHref(ev.stream, ev.offset) }, String(ev.offset))),
        h('td', {}, time(ev.stored_at)), h('td', {}, ev.type), h('td', { class: 'clip', title: ev.event_id }, ev.event_id),
        h('td', {}, ev.variant || '–'))), 'No events match.'),
    h('p', { class: 'muted' }, `${page.events.length} event${page.events.length === 1 ? '' : 's'}, newest first.`),
    pager(hrefOf, f, before, page.next_before));
}

// inboxSearch finds an inbox's items: #/inbox-search?inbox=NAME&….
async function inboxSearch(live, params) {
  const { view } = live;
  const name = params.get('inbox') || '';
  const f = filterOf(params);
  const before = params.get('before') || '';
  const hrefOf = (filter) => '#/inbox-search' + q({ inbox: name, ...filter });
  const parts = [h('h1', {}, `Search inbox ${name}`), h('p', {}, h('a', { href: '#/inbox' + q({ inbox: name }) }, '« inbox ' + name)),
    searchForm('item-search', hrefOf, f, true)];
  const page = await api(`/v1/inboxes/${encodeURIComponent(name)}/search` + q({ ...f, before, limit: PAGE }));
  parts.push(table('search-items-table', [h('th', { class: 'num' }, 'Id'), 'Created', 'State', 'Type', 'Event', 'Stream event',
    h('th', { class: 'num' }, 'Attempts'), 'Last error'],
  page.items.map((it) => h('tr', { dataset: { id: it.id } },
    h('td', { class: 'num' }, h('a', { href: itemHref(it) }, String(it.id))),
    h('td', {}, time(it.created_at)), h('td', {}, state(it.state)), h('td', {}, it.type),
    h('td', { class: 'clip', title: it.event_id }, it.event_id),
    h('td', {}, h('a', { href: eventHref(it.stream, it.offset) }, it.stream_event_id)),
    num(it.attempts), h('td', { class: 'clip', title: currentError(it) }, currentError(it)))), 'No items match.'));
  parts.push(h('p', { class: 'muted' }, `${page.items.length} item${page.items.length === 1 ? '' : 's'}, newest first.`),
    pager(hrefOf, f, before, page.next_before));
  put(view, ...parts);
}

export const eventPages = { event, stream, 'inbox-search': inboxSearch };
