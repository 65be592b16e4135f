// Moves what a producer makes into a detached response on the server's stream-step threads
// (ResponseStream::runBlocking), one drain at a time. The producer says that something came
// with kick(), from any thread and without blocking (an agent client's I/O thread: it must
// never wait for a client); a step then drains until the stream is over or nothing came
// meanwhile. A producer that never stops would keep its step for good and hold its party's
// other streams behind it: after `drains_per_turn` drains in a row the step goes back in line.
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "http/message.h"

namespace space::http {

class StreamDrain : public std::enable_shared_from_this<StreamDrain> {
 public:
  // `drain` runs on a step thread, may block, and says whether the stream is over (it ended
  // the response, or its client left). The drain holds `out`; what `drain` captures should not
  // own the producer, so that the last reference to it never goes on the producer's thread.
  static std::shared_ptr<StreamDrain> make(std::shared_ptr<ResponseStream> out, std::function<bool()> drain,
                                           int drains_per_turn = 16);

  // Something came: a drain runs soon (now, or after the one under way). If no step can run
  // (the stream closed, the server stops, the party's line is full) the stream is aborted.
  void kick();

 private:
  StreamDrain(std::shared_ptr<ResponseStream> out, std::function<bool()> drain, int drains_per_turn)
      : out_(std::move(out)), drain_(std::move(drain)), drains_per_turn_(drains_per_turn) {}
  void drainWhileKicked();
  // A step of drainWhileKicked; on false the stream was aborted and no drain runs.
  bool queue();

  std::shared_ptr<ResponseStream> out_;
  std::function<bool()> drain_;
  int drains_per_turn_;
  std::mutex m_;
  bool running_ = false;  // a step is queued or draining
  bool again_ = false;    // kicked while it was
};

}  // namespace space::http
