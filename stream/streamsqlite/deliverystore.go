package streamsqlite

import "github.com/postbox-events/postbox/internal/sealed"

// DeliveryStore marks the Backend as a server.Store: the database that
// keeps delivery state beside the streams (server.OpenSQLite).
func (b *Backend) DeliveryStore(sealed.Token) {}
