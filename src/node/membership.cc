// Cluster membership through etcd leases: the v3 JSON gateway over libcurl (membership.h).
#include "membership.h"

#if GENIE_WITH_ETCD
#include <curl/curl.h>
#endif

#include <array>
#include <mutex>

#include <nlohmann/json.hpp>

#include "genie/log.h"

namespace genie::node {

namespace {

using nlohmann::json;

constexpr std::string_view kBase64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t group = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) group |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) group |= static_cast<uint8_t>(bytes[i + 2]);
    out += kBase64[(group >> 18) & 63];
    out += kBase64[(group >> 12) & 63];
    out += i + 1 < bytes.size() ? kBase64[(group >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kBase64[group & 63] : '=';
  }
  return out;
}

/// The bytes of standard base64 `text` (padding optional), or an error.
Result<std::string> base64Decode(std::string_view text) {
  std::array<int8_t, 256> value;
  value.fill(-1);
  for (size_t i = 0; i < kBase64.size(); ++i) value[static_cast<uint8_t>(kBase64[i])] = static_cast<int8_t>(i);
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  std::string out;
  uint32_t bits = 0;
  int count = 0;
  for (char c : text) {
    int8_t v = value[static_cast<uint8_t>(c)];
    if (v < 0) return GENIE_ERROR(kInvalidMessage, "'{}' is not base64", text);
    bits = (bits << 6) | static_cast<uint32_t>(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out += static_cast<char>((bits >> count) & 0xff);
    }
  }
  return out;
}

/// etcd's range_end for "every key with this prefix": the prefix with its last byte that is
/// not 0xff incremented and what follows dropped; "\0" (every key) when all are 0xff.
std::string prefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<uint8_t>(end.back()) != 0xff) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

/// A 64-bit integer of the gateway's JSON: a decimal string (or a number); `fallback` if absent.
Result<int64_t> int64Field(const json& object, const char* name, int64_t fallback) {
  auto it = object.find(name);
  if (it == object.end()) return fallback;
  try {
    if (it->is_string()) return static_cast<int64_t>(std::stoll(it->get<std::string>()));
    if (it->is_number_integer()) return it->get<int64_t>();
  } catch (const std::exception&) {
  }
  return GENIE_ERROR(kInvalidMessage, "etcd's answer has a field '{}' that is not an integer: {}", name, it->dump());
}

#if GENIE_WITH_ETCD
size_t appendBody(char* data, size_t size, size_t count, void* body) {
  static_cast<std::string*>(body)->append(data, size * count);
  return size * count;
}
#endif

}  // namespace

// ---- NodeRecord ----------------------------------------------------------------------------

std::string encodeNodeRecord(const NodeRecord& record) {
  return json{{"address", record.address},           {"device", record.device},
              {"memory_limit", record.memory_limit}, {"memory_total", record.memory_total},
              {"version", record.version},           {"protocol_version", record.protocol_version},
              {"pid", record.pid}}
      .dump();
}

Result<NodeRecord> decodeNodeRecord(std::string_view text) {
  json object = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object()) return GENIE_ERROR(kInvalidMessage, "a node record is not a JSON object: '{}'", text);
  NodeRecord record;
  try {
    record.address = object.at("address").get<std::string>();
    record.device = object.at("device").get<std::string>();
    record.memory_limit = object.at("memory_limit").get<uint64_t>();
    record.memory_total = object.at("memory_total").get<uint64_t>();
    record.version = object.at("version").get<std::string>();
    record.protocol_version = object.at("protocol_version").get<uint32_t>();
    record.pid = object.at("pid").get<int64_t>();
  } catch (const json::exception& e) {
    return GENIE_ERROR(kInvalidMessage, "a node record lacks a field or has one of another type ({}): '{}'", e.what(),
                       text);
  }
  return record;
}

// ---- EtcdClient ----------------------------------------------------------------------------

#if GENIE_WITH_ETCD
Result<std::unique_ptr<EtcdClient>> EtcdClient::create(std::string url, std::chrono::milliseconds timeout) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0) {
    return GENIE_ERROR(kInvalidArgument, "etcd URL '{}' is not http://HOST:PORT", url);
  }
  static std::once_flag global_init;  // curl_global_init is not thread-safe: once per process
  std::call_once(global_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return GENIE_ERROR(kInternal, "curl_easy_init failed (etcd at {})", url);
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(url), timeout, curl));
}

EtcdClient::EtcdClient(std::string url, std::chrono::milliseconds timeout, void* curl)
    : url_(std::move(url)), timeout_(timeout), curl_(curl) {}

EtcdClient::~EtcdClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

Result<std::string> EtcdClient::post(std::string_view path, const std::string& body) {
  std::lock_guard<std::mutex> lock(mutex_);
  CURL* curl = static_cast<CURL*>(curl_);
  std::string endpoint = url_ + std::string(path), answer;
  char reason[CURL_ERROR_SIZE] = {};
  curl_easy_reset(curl);  // the handle keeps its connection to etcd between requests
  curl_easy_setopt(curl, CURLOPT_URL, endpoint.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_.count()));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout_.count()));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM: other threads run
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, reason);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, appendBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer);
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  CURLcode code = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (code != CURLE_OK) {
    return GENIE_ERROR(kPeerUnreachable, "etcd at {}: POST {} failed: {}", url_, path,
                       reason[0] != '\0' ? reason : curl_easy_strerror(code));
  }
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  if (status == 200) return answer;
  // The gateway's error: {"error": "...", "message": "...", "code": <gRPC code>}; 5: NOT_FOUND.
  json error = json::parse(answer, nullptr, /*allow_exceptions=*/false);
  std::string message = error.is_object() && error.contains("message") && error["message"].is_string()
                            ? error["message"].get<std::string>()
                            : answer.substr(0, 200);
  int grpc_code = error.is_object() && error.contains("code") && error["code"].is_number_integer()
                      ? error["code"].get<int>()
                      : -1;
  if (grpc_code == 5) return GENIE_ERROR(kNotFound, "etcd at {}: POST {}: {}", url_, path, message);
  return GENIE_ERROR(kRemote, "etcd at {}: POST {}: HTTP {}: {}", url_, path, status, message);
}
#else  // GENIE_WITH_ETCD: a build without libcurl refuses --etcd with a clear error
Result<std::unique_ptr<EtcdClient>> EtcdClient::create(std::string url, std::chrono::milliseconds timeout) {
  return GENIE_ERROR(kUnsupported, "etcd at {}: this genie-node was built without etcd membership "
                     "(GENIE_WITH_ETCD=OFF: libcurl was not at hand)", url);
}

EtcdClient::EtcdClient(std::string url, std::chrono::milliseconds timeout, void* curl)
    : url_(std::move(url)), timeout_(timeout), curl_(curl) {}

EtcdClient::~EtcdClient() = default;

Result<std::string> EtcdClient::post(std::string_view path, const std::string& body) {
  return GENIE_ERROR(kUnsupported, "etcd at {}: POST {}: built without etcd membership (GENIE_WITH_ETCD=OFF)", url_, path);
}
#endif  // GENIE_WITH_ETCD

Result<int64_t> EtcdClient::leaseGrant(std::chrono::seconds ttl) {
  auto answer = post("/v3/lease/grant", json{{"TTL", ttl.count()}}.dump());
  if (!answer) return answer.status();
  json object = json::parse(*answer, nullptr, false);
  if (!object.is_object()) return GENIE_ERROR(kInvalidMessage, "etcd at {}: lease grant answered '{}'", url_, *answer);
  if (object.contains("error")) {
    return GENIE_ERROR(kRemote, "etcd at {}: lease grant: {}", url_, object["error"].dump());
  }
  auto id = int64Field(object, "ID", 0);
  if (!id) return id.status();
  if (*id == 0) return GENIE_ERROR(kInvalidMessage, "etcd at {}: lease grant answered no ID: '{}'", url_, *answer);
  return id;
}

Result<int64_t> EtcdClient::leaseKeepAlive(int64_t id) {
  // A stream in gRPC; the gateway takes one request and answers {"result": {"ID", "TTL"}}.
  auto answer = post("/v3/lease/keepalive", json{{"ID", std::to_string(id)}}.dump());
  if (!answer) return answer.status();
  json object = json::parse(*answer, nullptr, false);
  if (!object.is_object() || !object.contains("result") || !object["result"].is_object()) {
    return GENIE_ERROR(kInvalidMessage, "etcd at {}: lease keepalive answered '{}'", url_, *answer);
  }
  auto ttl = int64Field(object["result"], "TTL", 0);  // absent (0): the lease has expired
  if (!ttl) return ttl.status();
  if (*ttl <= 0) return GENIE_ERROR(kNotFound, "etcd at {}: lease {:x} has expired", url_, id);
  return ttl;
}

Status EtcdClient::leaseRevoke(int64_t id) {
  auto answer = post("/v3/lease/revoke", json{{"ID", std::to_string(id)}}.dump());
  return answer ? Status::ok() : answer.status();
}

Status EtcdClient::put(std::string_view key, std::string_view value, int64_t lease) {
  json request{{"key", base64Encode(key)}, {"value", base64Encode(value)}};
  if (lease != 0) request["lease"] = std::to_string(lease);
  auto answer = post("/v3/kv/put", request.dump());
  return answer ? Status::ok() : answer.status();
}

Result<std::vector<std::pair<std::string, std::string>>> EtcdClient::rangePrefix(std::string_view prefix) {
  auto answer =
      post("/v3/kv/range", json{{"key", base64Encode(prefix)}, {"range_end", base64Encode(prefixEnd(prefix))}}.dump());
  if (!answer) return answer.status();
  json object = json::parse(*answer, nullptr, false);
  if (!object.is_object()) return GENIE_ERROR(kInvalidMessage, "etcd at {}: range answered '{}'", url_, *answer);
  std::vector<std::pair<std::string, std::string>> out;
  auto kvs = object.find("kvs");  // absent when no key matches
  if (kvs == object.end()) return out;
  if (!kvs->is_array()) return GENIE_ERROR(kInvalidMessage, "etcd at {}: range's kvs is not a list", url_);
  for (const json& kv : *kvs) {
    if (!kv.is_object() || !kv.contains("key") || !kv["key"].is_string()) {
      return GENIE_ERROR(kInvalidMessage, "etcd at {}: range answered a key-value without a key: {}", url_, kv.dump());
    }
    auto key = base64Decode(kv["key"].get<std::string>());
    auto value = base64Decode(kv.value("value", std::string()));  // an empty value is left out
    if (!key) return key.status();
    if (!value) return value.status();
    out.emplace_back(std::move(*key), std::move(*value));
  }
  return out;
}

// ---- Membership ----------------------------------------------------------------------------

Result<std::unique_ptr<Membership>> Membership::join(const MembershipConfig& config, const NodeRecord& record) {
  if (config.ttl.count() < 1) {
    return GENIE_ERROR(kInvalidArgument, "an etcd lease's TTL must be at least 1 s, not {} s", config.ttl.count());
  }
  if (config.prefix.empty()) return GENIE_ERROR(kInvalidArgument, "the etcd key prefix is empty");
  if (record.address.empty()) return GENIE_ERROR(kInvalidArgument, "a node registers with an empty address");
  auto etcd = EtcdClient::create(config.etcd_url, config.request_timeout);
  if (!etcd) return etcd.status();
  std::unique_ptr<Membership> membership(
      new Membership(config, config.prefix + record.address, encodeNodeRecord(record), std::move(*etcd)));
  GENIE_RETURN_IF_ERROR(membership->registerOnce());
  GENIE_LOG_INFO("genie-node: registered in etcd at {} as {} (lease {:x}, TTL {} s)", membership->etcd_->url(),
                 membership->key_, membership->lease_, config.ttl.count());
  membership->thread_ = std::thread([raw = membership.get()] { raw->keepAliveThread(); });
  return membership;
}

Membership::Membership(MembershipConfig config, std::string key, std::string value, std::unique_ptr<EtcdClient> etcd)
    : config_(std::move(config)), key_(std::move(key)), value_(std::move(value)), etcd_(std::move(etcd)) {}

Membership::~Membership() { leave(); }

Status Membership::registerOnce() {
  auto lease = etcd_->leaseGrant(config_.ttl);
  if (!lease) return lease.status();
  Status put = etcd_->put(key_, value_, *lease);
  if (!put.isOk()) {
    (void)etcd_->leaseRevoke(*lease);  // best effort: it expires anyway
    return put;
  }
  lease_ = *lease;
  return Status::ok();
}

void Membership::keepAliveThread() {
  const auto period = std::chrono::duration_cast<std::chrono::milliseconds>(config_.ttl) / 3;
  bool lost = false;  // etcd was unreachable or the registration was gone at the last tick
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
    lock.unlock();
    Status status;
    if (lease_ != 0) {
      auto ttl = etcd_->leaseKeepAlive(lease_);
      status = ttl.status();
      if (!ttl && ttl.status().code() == StatusCode::kNotFound) {
        GENIE_LOG_WARN("genie-node: etcd no longer knows the lease of {} (it expired, or etcd lost it); "
                       "registering again", key_);
        lease_ = 0;
      }
    }
    if (lease_ == 0) status = registerOnce();
    if (!status.isOk() && !lost) {
      GENIE_LOG_WARN("genie-node: lost etcd registration of {}: {}; serving on, retrying every {} ms", key_,
                     status.message(), period.count());
    } else if (status.isOk() && lost) {
      GENIE_LOG_WARN("genie-node: registered again in etcd at {} as {} (lease {:x})", etcd_->url(), key_, lease_);
    }
    lost = !status.isOk();
    lock.lock();
  }
}

void Membership::leave() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (lease_ == 0) return;
  Status revoke = etcd_->leaseRevoke(lease_);
  if (revoke.isOk()) {
    GENIE_LOG_INFO("genie-node: left etcd: {} deleted (lease {:x} revoked)", key_, lease_);
  } else {
    GENIE_LOG_WARN("genie-node: could not revoke the etcd lease of {} ({}); the key goes when its {} s TTL ends", key_,
                   revoke.message(), config_.ttl.count());
  }
  lease_ = 0;
}

}  // namespace genie::node
