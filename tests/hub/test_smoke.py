def test_service_answers_behind_hub(hub):
    token = hub.add_user("alice")
    r = hub.api("GET", "/api/profiles", token)
    assert r.status_code == 200, r.text
    names = [p["name"] for p in r.json()["profiles"]]
    assert "mig-1g.10gb" in names
    r = hub.api("POST", "/api/allocations", token, json={"profile": "mig-1g.10gb"})
    assert r.status_code == 201, r.text
    print(r.json())
