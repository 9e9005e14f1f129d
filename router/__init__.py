"""The topic router: the one authority for subscriptions, sessions, retained messages and the store."""
