"""REST routers of the gateway, one module per resource; create_app includes them."""
